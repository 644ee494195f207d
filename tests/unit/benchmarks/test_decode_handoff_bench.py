"""``benchmarks/decode_handoff.py`` runs end to end on the tiny model: a stream handed off over
the gRPC KV transfer, continued from its pulled blocks and, as the peer, recomputed; both give
the uninterrupted run's tokens, and the JSON line carries the keys the docs record."""

from __future__ import annotations

import json

import pytest

from benchmarks.decode_handoff import main

pytestmark = pytest.mark.timeout(180)


def test_the_benchmark_hands_off_and_prints_its_keys(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model", "builtin:tiny-llama", "--prompt-tokens", "100", "--generated", "12"]
    assert main([*args, "--repeats", "1", "--kv-bytes", str(16 << 20)]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["tokens_identical"] is True
    assert result["blocks_pulled"] >= 100 // 16  # at least the prompt's full blocks
    for key in ("continuation_ttft_pulled_ms", "continuation_ttft_recompute_ms", "pull_ms"):
        assert result[key] > 0
