"""Tokenizer: round trips, special tokens, BOS handling, file errors, parity with HF."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from core.errors import ConfigError, ModelNotFoundError
from engine.builtin.byte_tokenizer import BOS_TOKEN_ID, EOS_TOKEN_ID, IM_END_TOKEN_ID
from engine.tokenizer import Tokenizer

TEXTS = [
    "",
    "Hello, world!",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n",
    "emoji 🎉🚀 and a family 👨‍👩‍👧",
    "CJK 世界你好, 日本語, 한국어",
    "combining: e\u0301 a\u0308 n\u0303 (decomposed)",
    "mixed ünïcödé ß ∑ ≠ 𝔘𝔫𝔦",
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == list(text.encode("utf-8"))  # byte-level: one token per byte
    assert tokenizer.decode(ids) == text
    with_bos = tokenizer.encode(text)
    assert with_bos == [BOS_TOKEN_ID, *ids]
    assert tokenizer.decode(with_bos) == text
    assert tokenizer.decode(with_bos, skip_special_tokens=False) == "<|begin_of_text|>" + text


def test_special_tokens_and_ids(tokenizer: Tokenizer) -> None:
    assert tokenizer.bos_token_id == BOS_TOKEN_ID
    assert tokenizer.eos_token_id == EOS_TOKEN_ID
    # tokenizer_config's eos first, then generation_config's extra end-of-turn id
    assert tokenizer.eos_token_ids == (EOS_TOKEN_ID, IM_END_TOKEN_ID)
    assert tokenizer.vocab_size == 320
    assert tokenizer.special_token_ids == frozenset(range(256, 320))
    ids = tokenizer.encode("a<|im_start|>b", add_special_tokens=False)
    assert ids == [ord("a"), tokenizer.backend.token_to_id("<|im_start|>"), ord("b")]
    assert tokenizer.decode(ids) == "ab"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "a<|im_start|>b"
    assert tokenizer.id_to_token(ord("A")) == "A"
    assert tokenizer.id_to_token(10_000) is None


def test_invalid_utf8_decodes_to_replacement(tokenizer: Tokenizer) -> None:
    assert tokenizer.decode([0xE4, 0xB8]) == "\ufffd"  # incomplete character
    assert tokenizer.decode([0xE4, 0xB8, 0xAD]) == "中"
    assert tokenizer.decode([0xFF, ord("a")]) == "\ufffda"


def _copy_tokenizer_dir(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(src / name, dst / name)
    return dst


def _edit_json(path: Path, **changes: object) -> None:
    body = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    path.write_text(json.dumps(body))


def test_add_bos_token_prepends_when_backend_does_not(tiny_model_dir: Path, tmp_path: Path) -> None:
    directory = _copy_tokenizer_dir(tiny_model_dir, tmp_path / "tok")
    _edit_json(directory / "tokenizer.json", post_processor=None)
    assert Tokenizer.from_dir(directory).encode("hi") == [BOS_TOKEN_ID, *b"hi"]
    _edit_json(directory / "tokenizer_config.json", add_bos_token=None)
    assert Tokenizer.from_dir(directory).encode("hi") == list(b"hi")


def test_add_bos_token_false_strips_backend_bos(tiny_model_dir: Path, tmp_path: Path) -> None:
    directory = _copy_tokenizer_dir(tiny_model_dir, tmp_path / "tok")
    _edit_json(directory / "tokenizer_config.json", add_bos_token=False)
    tokenizer = Tokenizer.from_dir(directory)
    assert tokenizer.encode("hi") == list(b"hi")
    assert tokenizer.encode("<|begin_of_text|>hi") == [BOS_TOKEN_ID, *b"hi"]  # text BOS stays


def test_added_token_dict_form_and_generation_eos(tiny_model_dir: Path, tmp_path: Path) -> None:
    directory = _copy_tokenizer_dir(tiny_model_dir, tmp_path / "tok")
    _edit_json(directory / "tokenizer_config.json", eos_token={"content": "<|im_end|>"})
    _edit_json(directory / "generation_config.json", eos_token_id=EOS_TOKEN_ID)
    assert Tokenizer.from_dir(directory).eos_token_ids == (IM_END_TOKEN_ID, EOS_TOKEN_ID)
    (directory / "generation_config.json").unlink()
    assert Tokenizer.from_dir(directory).eos_token_ids == (IM_END_TOKEN_ID,)


def test_missing_files_are_typed_errors(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError) as missing_dir:
        Tokenizer.from_dir(tmp_path / "nowhere")
    assert missing_dir.value.param == "tokenizer.json"
    assert "nowhere" in missing_dir.value.message
    directory = _copy_tokenizer_dir(tiny_model_dir, tmp_path / "tok")
    (directory / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError) as corrupt:
        Tokenizer.from_dir(directory)
    assert corrupt.value.param == "tokenizer.json"
    shutil.copy(tiny_model_dir / "tokenizer.json", directory / "tokenizer.json")
    (directory / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError) as bad_config:
        Tokenizer.from_dir(directory)
    assert bad_config.value.param == "tokenizer_config.json"


def test_agrees_with_hf_auto_tokenizer(tokenizer: Tokenizer, tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    for text in TEXTS:
        assert tokenizer.encode(text) == hf(text).input_ids
        assert (
            tokenizer.encode(text, add_special_tokens=False)
            == hf(text, add_special_tokens=False).input_ids
        )
        ids = tokenizer.encode(text)
        assert tokenizer.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi 🎉"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "世界?"},
    ]
    for add_generation_prompt in (True, False):
        ours = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        theirs = hf.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        assert ours == theirs
    assert hf.eos_token_id == tokenizer.eos_token_id
