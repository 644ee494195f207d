"""``pdserve bench`` / ``bench compare`` through typer's CliRunner against the fake server."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cluster.ops.cli import app
from loadtest.sweep import find_knee, first_non_scaling_step
from tests.unit.loadtest.fake_server import FakeBehaviour

runner = CliRunner()
VLLM_FIELDS = (
    "date",
    "backend",
    "model_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "std")),
    *(f"p{p}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for p in ("50", "99")),
)


def test_help_lists_vllm_flags() -> None:
    result = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for flag in (
        "--base-url",
        "--dataset-name",
        "--random-range-ratio",
        "--goodput",
        "--metric-percentiles",
        "--no-progress",
        "--sweep",
    ):
        assert flag in result.output
    assert "compare" in result.output
    assert runner.invoke(app, ["bench", "compare", "--help"]).exit_code == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bench", "--no-such-flag"], "No such option"),
        (["bench", "--num-prompts", "many"], "Invalid value for '--num-prompts'"),
        (["bench", "--goodput", "ttft=5", "--no-progress"], "bad --goodput"),
        (["bench", "--dataset-name", "nope", "--no-progress"], "unknown --dataset-name"),
        (["bench", "--percentile-metrics", "foo", "--no-progress"], "percentile-metrics"),
        (["bench", "--backend", "tgi"], "unknown --backend"),
        (["bench", "--workload", "/no/such.yaml"], "no workload file"),
        (["bench", "--num-prompts", "0", "--no-progress"], "num_requests"),
        (["bench", "compare", "/no/a.json", "/no/b.json"], "cannot read"),
    ],
)
def test_bad_input_is_a_clean_error(args: list[str], message: str) -> None:
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)


def test_run_writes_vllm_compatible_results(fake_server: Callable, tmp_path: Path) -> None:
    server, url = fake_server(FakeBehaviour(ttft_s=0.01, itl_s=0.002, faults={2: "truncate"}))
    args = [
        "bench",
        "--base-url",
        url,
        "--model",
        "m",
        "--num-prompts",
        "6",
        "--random-input-len",
        "20",
        "--random-output-len",
        "5",
        "--max-concurrency",
        "2",
        "--goodput",
        "ttft:1000",
        "--goodput",
        "tpot:1000 e2el:5000",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--result-dir",
        str(tmp_path),
        "--result-filename",
        "run.json",
        "--no-progress",
        "--label",
        "t1",
    ]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "run.json").read_text())
    for field in VLLM_FIELDS:
        assert field in summary, field
    assert summary["completed"] == 5 and summary["failed"] == 1
    assert summary["failures_by_kind"] == {"truncated": 1}
    assert summary["request_goodput"] == pytest.approx(5 / summary["duration"])
    assert summary["label"] == "t1" and summary["request_rate"] == "inf"
    lines = (tmp_path / "run.requests.jsonl").read_text().splitlines()
    assert len(lines) == 6
    kinds = sorted(str(json.loads(line)["failure_kind"]) for line in lines)
    assert kinds == ["None"] * 5 + ["truncated"]
    assert "| TTFT |" in (tmp_path / "run.md").read_text()
    for kind in ("ttft_vs_input", "itl_cdf", "timeline"):
        assert (tmp_path / f"run.{kind}.png").read_bytes()[:4] == b"\x89PNG"
    bodies = [r.body for r in server.received]
    assert all(b["ignore_eos"] is True and b["max_tokens"] == 5 for b in bodies)
    assert "completed" in result.output


def test_compare_prints_side_by_side(tmp_path: Path) -> None:
    a = {"completed": 10, "request_throughput": 2.0, "mean_ttft_ms": 100.0, "failed": 0}
    b = {"completed": 10, "request_throughput": 3.0, "mean_ttft_ms": 80.0, "failed": 1}
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    result = runner.invoke(
        app,
        ["bench", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    lines = {line.split("│")[1].strip(): line for line in result.output.splitlines() if "│" in line}
    assert "+50.0%" in lines["request_throughput"] and lines["request_throughput"].rstrip(
        " │"
    ).endswith("B")
    assert "-20.0%" in lines["mean_ttft_ms"] and lines["mean_ttft_ms"].rstrip(" │").endswith("B")
    assert lines["failed"].rstrip(" │").endswith("A")


def test_knee_detection() -> None:
    loads = [1, 2, 4, 8, 16]
    assert find_knee(loads, [10, 20, 39, 45, 46], min_gain=0.5) == 2  # 39 -> 45 is +15% for +100%
    assert first_non_scaling_step(loads, [10, 20, 40, 80, 160], 0.5) is None
    assert find_knee(loads, [10, 20, 40, 80, 160], 0.5) is None
    assert find_knee([1, 2], [5.0, 5.1], 0.5) == 0


def test_sweep_over_concurrency_finds_a_knee(fake_server: Callable, tmp_path: Path) -> None:
    # The fake server runs any number of requests in parallel, so throughput grows with the
    # client's concurrency until all 4 requests fit in one wave: 4 -> 8 adds nothing.
    _server, url = fake_server(FakeBehaviour(ttft_s=0.25, itl_s=0.01))
    args = [
        "bench",
        "--base-url",
        url,
        "--model",
        "m",
        "--num-prompts",
        "4",
        "--random-input-len",
        "8",
        "--random-output-len",
        "6",
        "--sweep",
        "concurrency",
        "--sweep-values",
        "1,4,8",
        "--save-result",
        "--result-dir",
        str(tmp_path),
        "--result-filename",
        "s.json",
        "--no-progress",
        "--no-plots",
    ]
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    sweep = json.loads((tmp_path / "s.sweep.json").read_text())
    assert [level["load"] for level in sweep["levels"]] == [1.0, 4.0, 8.0]
    throughputs = [level["request_throughput"] for level in sweep["levels"]]
    assert throughputs[1] > 2.5 * throughputs[0]
    assert sweep["knee_load"] == 4.0
    assert (tmp_path / "s-concurrency8.json").is_file()
    assert "knee" in result.output


def test_exit_status_when_nothing_succeeds(closed_port_url: str) -> None:
    args = ["bench", "--base-url", closed_port_url, "--num-prompts", "2", "--no-progress"]
    no_model = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert no_model.exit_code == 2 and "pass --model" in no_model.output
    refused = runner.invoke(app, [*args, "--model", "m"], env={"COLUMNS": "200"})
    assert refused.exit_code == 1 and "no request succeeded" in refused.output
    assert "connection_error" in refused.output
