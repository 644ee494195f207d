"""Preflight against the server's max_model_len, and failure reasons grouped on the console."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from cluster.ops.cli import app
from loadtest.failures import failure_reasons, reason_line
from loadtest.preflight import request_sizes
from loadtest.types import FailureKind, RequestRecord, Session, Turn
from tests.unit.loadtest.fake_server import FakeBehaviour

runner = CliRunner()
ENV = {"COLUMNS": "200"}


def byte_server(**kw: object) -> FakeBehaviour:
    """A fake server that counts like the built-in byte tokenizer (one token per byte + BOS)."""
    return FakeBehaviour(
        ttft_s=0.002,
        itl_s=0.001,
        serves_tokenize=True,
        tokens_of=lambda text: len(text.encode()),
        bos_tokens=1,
        **kw,  # type: ignore[arg-type]
    )


def bench(url: str, *extra: str) -> list[str]:
    return ["bench", "--base-url", url, "--no-progress", "--seed", "1", *extra]


def test_preflight_refuses_with_one_line_and_sends_nothing(fake_server: Callable) -> None:
    server, url = fake_server(byte_server(max_model_len=2048))
    result = runner.invoke(app, bench(url, "--dataset-name", "long-32k", "--num-prompts", "2"))
    assert result.exit_code == 2, result.output
    (line,) = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert line.startswith("error: preflight: the workload's largest request needs ")
    assert "max_model_len is 2,048" in line and "--random-input-len" in line
    assert "configs/local-long-context.yaml" in line and "--no-preflight" in line
    assert server.received == [] and server.probes == []  # /tokenize only: nothing generated


def test_preflight_passes_a_workload_that_fits(fake_server: Callable) -> None:
    server, url = fake_server(byte_server(max_model_len=2048))
    args = bench(url, "--num-prompts", "3", "--random-input-len", "2000", "--random-output-len")
    args.append("48")
    result = runner.invoke(app, args, env=ENV)
    assert result.exit_code == 0, result.output  # 2000 prompt + 48 output = 2048: fits exactly
    assert len(server.received) == 3
    over = runner.invoke(app, [*args[:-1], "49"], env=ENV)
    assert over.exit_code == 2 and "2,049 tokens" in over.output


def test_every_request_failing_prints_grouped_reasons_and_exits_1(
    fake_server: Callable, tmp_path: Path
) -> None:
    server, url = fake_server(byte_server(max_model_len=2048))
    args = bench(url, "--dataset-name", "long-32k", "--num-prompts", "2", "--no-preflight")
    args += ["--save-result", "--result-dir", str(tmp_path), "--result-filename", "r.json"]
    result = runner.invoke(app, [*args, "--no-plots"], env=ENV)
    assert result.exit_code == 1, result.output
    assert len(server.received) == 2
    lines = [ln.strip() for ln in result.output.splitlines()]
    grouped = [ln for ln in lines if ln.startswith("2 × HTTP 400: ")]
    assert len(grouped) == 1, result.output
    assert "this model's maximum context length is 2048 tokens; you requested " in grouped[0]
    assert lines[-1].startswith("error: no request succeeded (2 failed")
    summary = json.loads((tmp_path / "r.json").read_text())
    (reason,) = summary["failure_reasons"]
    assert (reason["count"], reason["kind"], reason["http_status"]) == (2, "http_status", 400)
    assert "| 2 | HTTP 400 | this model's maximum context length" in (tmp_path / "r.md").read_text()


def test_partly_failing_run_prints_reasons_and_exits_0(fake_server: Callable) -> None:
    _server, url = fake_server(byte_server(max_model_len=2048, faults={1: "http_500"}))
    args = bench(url, "--num-prompts", "4", "--random-input-len", "64", "--max-concurrency", "1")
    result = runner.invoke(app, args, env=ENV)
    assert result.exit_code == 0, result.output
    assert "1 × HTTP 500: injected http_500" in result.output


def record(kind: FailureKind | None, error: str = "", status: int | None = None) -> RequestRecord:
    return RequestRecord(
        request_id="r",
        session_id=0,
        turn_index=0,
        success=kind is None,
        start_s=0.0,
        queue_s=0.0,
        prompt_tokens=1,
        output_tokens=0,
        ttft_s=0.0,
        latency_s=0.0,
        failure_kind=kind,
        error=error,
        http_status=status,
    )


def test_failures_group_by_kind_status_and_message_shape() -> None:
    too_long = "maximum context length is 2048 tokens; the prompt has {} tokens"
    records = [
        record(FailureKind.HTTP_STATUS, too_long.format(9059), 400),
        record(FailureKind.HTTP_STATUS, too_long.format(52430), 400),
        record(FailureKind.HTTP_STATUS, too_long.format(20000), 400),
        record(FailureKind.HTTP_STATUS, too_long.format(9059), 413),
        record(FailureKind.TIMEOUT, "request cmpl-3fa9c2d1 timed out after 600.0s"),
        record(FailureKind.TIMEOUT, "request cmpl-77aa01bc timed out after 600.0s"),
        record(FailureKind.TRUNCATED, ""),
        record(None),
    ]
    lines = [reason_line(r) for r in failure_reasons(records)]
    assert lines == [
        "3 × HTTP 400: maximum context length is 2048 tokens; the prompt has 9059..52430 tokens",
        "2 × timeout: request cmpl-* timed out after 600.0s",
        "1 × HTTP 413: maximum context length is 2048 tokens; the prompt has 9059 tokens",
        "1 × truncated: (no message)",
    ]


def test_request_sizes_bound_multi_turn_history() -> None:
    session = Session(
        session_id=4,
        turns=(Turn("a", 10, 5), Turn("b", 20, 7)),
        system_text="s",
        system_tokens=3,
    )
    sizes = list(request_sizes([session], overhead_tokens=1))
    assert [(s.prompt_tokens, s.total_tokens) for s in sizes] == [(14, 19), (39, 46)]


def test_no_max_model_len_skips_preflight_with_a_warning(fake_server: Callable) -> None:
    server, url = fake_server(byte_server(max_model_len=None))
    args = bench(url, "--num-prompts", "2", "--random-input-len", "32", "--random-output-len", "4")
    result = runner.invoke(app, args, env=ENV)
    assert result.exit_code == 0, result.output
    assert "no preflight check" in result.output and len(server.received) == 2
