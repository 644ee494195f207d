"""Prompt synthesis and workloads: exact token counts, shared text, lengths, presets, traces."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from core.errors import ConfigError, ModelNotFoundError
from loadtest.bench import prepare_sessions
from loadtest.config import LengthConfig, LoadTestConfig
from loadtest.flags import validate
from loadtest.lengths import sample_length
from loadtest.text import TextSynthesizer
from loadtest.tokens import HFTokenCounter, TokenCounter, WordCounter, load_token_counter
from loadtest.trace import read_trace
from loadtest.workload_presets import PRESET_WORKLOADS, preset_workload
from loadtest.workloads import build_sessions


def _counter(kind: str, bpe: str, byte_dir: str) -> TokenCounter:
    if kind == "approx":
        return WordCounter()
    return load_token_counter(bpe if kind == "bpe" else byte_dir)


@pytest.mark.parametrize("kind", ["approx", "bpe", "byte"])
def test_texts_have_exact_token_counts(
    kind: str, bpe_tokenizer_json: str, byte_tokenizer_json: str
) -> None:
    counter = _counter(kind, bpe_tokenizer_json, byte_tokenizer_json)
    synth = TextSynthesizer(counter)
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 17, 256, 4000):
        text, tokens = synth.make(n, rng)
        assert tokens == n
        assert counter.count(text) == n


def test_approximation_is_one_token_per_word() -> None:
    text, tokens = TextSynthesizer(WordCounter()).make(50, np.random.default_rng(1))
    assert tokens == len(text.split()) == 50
    assert all(word.isalpha() for word in text.split())


def test_load_token_counter_resolution(tmp_path: Path, byte_tokenizer_json: str) -> None:
    assert isinstance(load_token_counter(None), WordCounter)
    assert isinstance(load_token_counter(None, model=byte_tokenizer_json), HFTokenCounter)
    assert load_token_counter(str(Path(byte_tokenizer_json) / "tokenizer.json")).exact
    with pytest.raises(ModelNotFoundError, match=r"no tokenizer\.json"):
        load_token_counter(str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="run the model once"):
        load_token_counter("builtin:definitely-not-cached-model")


def test_lengths() -> None:
    rng = np.random.default_rng(0)
    uniform = LengthConfig(tokens=100, range_ratio=0.2)
    draws = [sample_length(uniform, rng) for _ in range(2000)]
    assert min(draws) == 80 and max(draws) == 120
    assert sample_length(LengthConfig(distribution="fixed", tokens=7), rng) == 7
    lognormal = LengthConfig(
        distribution="lognormal", tokens=1000, sigma=1.0, min_tokens=500, max_tokens=4000
    )
    draws = [sample_length(lognormal, rng) for _ in range(4000)]
    assert min(draws) == 500 and max(draws) == 4000
    assert np.median(draws) == pytest.approx(1000, rel=0.1)


def _config(workload: dict, num: int = 40) -> LoadTestConfig:
    return validate({"workload": workload, "arrivals": {"num_requests": num, "seed": 5}}, "test")


def test_random_workload_with_shared_prefix(bpe_tokenizer_json: str) -> None:
    counter = load_token_counter(bpe_tokenizer_json)
    workload = {
        "kind": "random",
        "input_len": {"tokens": 64, "range_ratio": 0.5},
        "output_len": {"tokens": 16},
        "prefix_len_tokens": 32,
    }
    sessions = prepare_sessions(_config(workload), counter)
    assert len(sessions) == 40
    for session in sessions:
        (turn,) = session.turns
        assert 32 + 32 <= turn.text_tokens <= 32 + 96
        assert counter.count(turn.text) == turn.text_tokens
        assert turn.max_output_tokens == 16
    texts = [s.turns[0].text for s in sessions]
    common = next(
        (texts[0][:i] for i in range(len(texts[0])) if any(t[i] != texts[0][i] for t in texts)),
        texts[0],
    )
    assert 32 <= counter.count(common) <= 33  # the same 32 tokens open every prompt
    again = prepare_sessions(_config(workload), counter)
    assert [s.turns for s in again] == [s.turns for s in sessions]  # seeded


def test_shared_prefix_groups_share_exact_prefixes() -> None:
    workload = {
        "kind": "shared-prefix",
        "num_groups": 3,
        "prefix_len_tokens": 20,
        "suffix_len": {"tokens": 10, "distribution": "fixed"},
    }
    sessions = prepare_sessions(_config(workload, num=30), WordCounter())
    prefixes = {" ".join(s.turns[0].text.split()[:20]) for s in sessions}
    suffixes = {" ".join(s.turns[0].text.split()[20:]) for s in sessions}
    assert len(prefixes) == 3
    assert len(suffixes) == 30
    assert all(s.turns[0].text_tokens == 30 for s in sessions)


def test_multi_turn_sessions() -> None:
    workload = {
        "kind": "multi-turn",
        "num_turns": 3,
        "think_time_s": 0.5,
        "system_prompt_len_tokens": 12,
        "user_len": {"tokens": 8, "distribution": "fixed"},
    }
    sessions = prepare_sessions(_config(workload, num=200), WordCounter())
    assert all(len(s.turns) == 3 and s.system_tokens == 12 for s in sessions)
    assert len({s.system_text for s in sessions}) == 1
    assert all(s.turns[0].think_time_s == 0.0 for s in sessions)
    thinks = [t.think_time_s for s in sessions for t in s.turns[1:]]
    assert np.mean(thinks) == pytest.approx(0.5, rel=0.15)


def test_presets_are_valid_workloads() -> None:
    for name in PRESET_WORKLOADS:
        config = _config(preset_workload(name), num=3)
        assert config.workload.kind in ("random", "shared-prefix", "multi-turn", "long-short-mix")
    long_128k = _config(preset_workload("long-128k")).workload
    assert long_128k.input_len.max_tokens == 131072  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="long-32k"):
        preset_workload("nope")


def _write_trace(path: Path, rows: list[dict]) -> None:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_trace_prompts_share_text_where_hash_ids_match(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 1000, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 3]},
        {"timestamp": 1500, "input_length": 36, "output_length": 6, "hash_ids": [1, 2, 4]},
        {"timestamp": 3000, "input_length": 20, "output_length": 7, "hash_ids": [5, 2]},
        {"timestamp": 3000, "input_length": 12, "output_length": 8, "hash_ids": [1]},
    ]
    _write_trace(tmp_path / "t.jsonl", rows)
    workload = {"kind": "mooncake-trace", "path": "t.jsonl", "block_size_tokens": 16}
    config = _config(workload, num=10)
    sessions = list(build_sessions(config.workload, TextSynthesizer(WordCounter()), 0, tmp_path))
    words = [s.turns[0].text.split() for s in sessions]
    assert [len(w) for w in words] == [40, 36, 20, 12]
    assert [s.arrival_s for s in sessions] == pytest.approx([0.0, 0.5, 2.0, 2.0])
    assert [s.turns[0].max_output_tokens for s in sessions] == [5, 6, 7, 8]
    assert words[0][:32] == words[1][:32]  # hash ids 1, 2 shared
    assert words[0][32:] != words[1][32:36]
    assert words[2][16:20] == words[0][16:20]  # hash id 2 in second position: same text
    assert words[2][:16] != words[0][:16]
    assert words[3] == words[0][:12]  # partial block: a prefix of block 1


def test_trace_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1}\n')
    with pytest.raises(ConfigError, match=r"bad\.jsonl:2"):
        read_trace(path)
    with pytest.raises(ConfigError, match="cannot read trace"):
        read_trace(tmp_path / "missing.jsonl")


def test_sessions_are_lazy_and_endless() -> None:
    config = _config({"kind": "random", "input_len": {"tokens": 4}})
    sessions = build_sessions(config.workload, TextSynthesizer(WordCounter()), 0)
    assert len(list(itertools.islice(sessions, 2000))) == 2000


def test_builtin_model_name_finds_the_cached_tokenizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, byte_tokenizer_json: str
) -> None:
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    assert isinstance(load_token_counter(None, model="builtin:tiny-x"), WordCounter)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny-x").symlink_to(byte_tokenizer_json, target_is_directory=True)
    counter = load_token_counter(None, model="builtin:tiny-x")
    assert counter.exact and counter.count(" the") == 4  # one token per byte
    assert load_token_counter("builtin:tiny-x").exact
