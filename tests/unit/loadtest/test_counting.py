"""Prompt lengths without a local tokenizer: the server counts, else usage calibrates."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cluster.ops.cli import app
from loadtest.calibration import fit, probe_chunks
from tests.unit.loadtest.fake_server import FakeBehaviour

runner = CliRunner()


def byte_count(text: str) -> int:
    return len(text.encode())


def run_cli(url: str, tmp_path: Path, *extra: str) -> tuple[dict[str, Any], list[dict]]:
    args = ["bench", "--base-url", url, "--no-progress", "--no-plots", "--seed", "3"]
    args += ["--save-result", "--result-dir", str(tmp_path), "--result-filename", "r.json"]
    result = runner.invoke(app, [*args, *extra], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "r.json").read_text())
    lines = (tmp_path / "r.requests.jsonl").read_text().splitlines()
    return summary, [json.loads(line) for line in lines]


def test_server_counts_make_prompts_exactly_the_requested_length(
    fake_server: Callable, tmp_path: Path
) -> None:
    behaviour = FakeBehaviour(
        ttft_s=0.002, itl_s=0.001, serves_tokenize=True, tokens_of=byte_count, bos_tokens=1
    )
    server, url = fake_server(behaviour)
    summary, records = run_cli(
        url, tmp_path, "--num-prompts", "4", "--random-input-len", "300", "--random-output-len", "4"
    )
    assert summary["token_counts"] == "server" and summary["tokenizer_id"].endswith("/tokenize")
    assert summary["prompt_overhead_tokens"] == 1
    assert [r["prompt_tokens"] for r in records] == [300] * 4  # the server's usage
    assert [r["expected_prompt_tokens"] for r in records] == [300] * 4
    assert summary["prompt_token_error_pct"]["max_abs"] == 0.0
    assert server.probes == [] and server.num_tokenize_calls > 0


def test_without_tokenize_usage_calibrates_the_estimate(
    fake_server: Callable, tmp_path: Path
) -> None:
    behaviour = FakeBehaviour(ttft_s=0.002, itl_s=0.001, tokens_of=byte_count, bos_tokens=1)
    server, url = fake_server(behaviour)
    summary, records = run_cli(
        url, tmp_path, "--num-prompts", "6", "--random-input-len", "3000", "--random-output-len=4"
    )
    assert summary["token_counts"] == "calibrated"
    calibration = summary["token_calibration"]
    assert calibration["num_probes"] == 2 and 5.0 < calibration["tokens_per_word"] < 7.0
    assert calibration["overhead_tokens"] == 1  # the fake server's BOS
    assert len(server.probes) == 2 and len(server.received) == 6  # probes are not the run's
    error = summary["prompt_token_error_pct"]
    # the spread of random word choice: ~1/sqrt(500 words) per prompt, no bias beyond it
    assert error["requests"] == 6 and error["max_abs"] < 4.0 and abs(error["mean"]) < 2.5, error
    assert all(abs(r["prompt_tokens"] - 3000) < 120 for r in records)


def test_without_tokenize_or_usage_the_estimate_is_approximate(
    fake_server: Callable, tmp_path: Path
) -> None:
    behaviour = FakeBehaviour(ttft_s=0.002, itl_s=0.001, include_usage=False)
    _server, url = fake_server(behaviour)
    summary, _records = run_cli(url, tmp_path, "--num-prompts", "2", "--random-input-len", "20")
    assert summary["token_counts"] == "approximate"
    assert summary["prompt_token_error_pct"] is None


def test_calibration_fit_and_probe_chunks() -> None:
    words = [115, 115]
    calibration = fit([1 + 115 * 6, 1 + 115 * 5], words, 1 + 230 * 6)
    assert calibration.tokens_per_word == pytest.approx(5.5)
    assert calibration.overhead_tokens == 1 and calibration.num_probes == 3
    assert calibration.fit_error_pct == pytest.approx(100 * 57.5 / 576, rel=1e-3)
    vocabulary = sum(len(c) for c in probe_chunks(None))
    assert len(probe_chunks(None)) == 1 and vocabulary > 150
    chunks = probe_chunks(2048)
    assert sum(len(c) for c in chunks) == vocabulary and max(len(c) for c in chunks) <= 127
    assert max(len(c) for c in probe_chunks(64)) <= 3
