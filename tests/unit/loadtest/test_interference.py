"""The long-short mix: evenly spread long requests, and short-request latency split around the
long prompts' prefill windows (summary section, Markdown and plot)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cluster.ops.cli import app
from loadtest.bench import prepare_sessions
from loadtest.flags import validate
from loadtest.interference import interference_summary, split_short_samples
from loadtest.tokens import WordCounter
from loadtest.types import RequestRecord
from tests.unit.loadtest.fake_server import FakeBehaviour


def rec(label: str, start_s: float, ttft_s: float, itl_s: tuple[float, ...] = ()) -> RequestRecord:
    return RequestRecord(
        request_id=f"{label}-{start_s}",
        session_id=0,
        turn_index=0,
        success=True,
        start_s=start_s,
        queue_s=0.0,
        prompt_tokens=1000 if label == "long" else 10,
        output_tokens=len(itl_s) + 1,
        ttft_s=ttft_s,
        latency_s=ttft_s + sum(itl_s),
        itl_s=itl_s,
        label=label,
    )


def test_short_samples_split_at_the_long_prefill_windows() -> None:
    records = [
        rec("long", 1.0, 4.0),  # prefills over [1, 5]
        rec("short", 2.0, 0.5, (0.3, 0.3)),  # tokens at 2.5, 2.8, 3.1: all inside
        rec("short", 4.8, 0.1, (0.3, 0.3)),  # TTFT inside; gaps 4.9-5.2 inside, 5.2-5.5 not
        rec("short", 10.0, 0.2, (0.1,)),  # all outside
    ]
    samples = split_short_samples(records, [(1.0, 5.0)])
    assert samples["during"]["ttft"] == pytest.approx([0.5, 0.1])
    assert samples["during"]["itl"] == pytest.approx([0.3, 0.3, 0.3])
    assert samples["outside"]["ttft"] == pytest.approx([0.2])
    assert samples["outside"]["itl"] == pytest.approx([0.3, 0.1])
    summary = interference_summary(records)
    assert summary is not None
    assert (summary["long_requests"], summary["short_requests"]) == (1, 3)
    assert summary["long_prefill_total_s"] == pytest.approx(4.0)
    during = summary["short_during_long_prefill"]
    assert during["num_ttft_samples"] == 2 and during["p50_ttft_ms"] == pytest.approx(300.0)
    assert summary["short_all"]["num_itl_samples"] == 5
    assert interference_summary([rec("short", 0.0, 0.1)]) is None


MIX = {
    "kind": "long-short-mix",
    "long_fraction": 0.25,
    "long_input_len": {"distribution": "fixed", "tokens": 400},
    "long_output_len": {"distribution": "fixed", "tokens": 2},
    "short_input_len": {"distribution": "fixed", "tokens": 20},
    "short_output_len": {"distribution": "fixed", "tokens": 6},
}


def test_long_requests_are_spread_evenly_and_labelled() -> None:
    config = validate({"workload": MIX, "arrivals": {"num_requests": 8}}, "test")
    sessions = prepare_sessions(config, WordCounter())
    assert [s.label for s in sessions] == ["short"] * 3 + ["long"] + ["short"] * 3 + ["long"]
    assert [s.turns[0].text_tokens for s in sessions[2:4]] == [20, 400]
    assert [s.turns[0].max_output_tokens for s in sessions[2:4]] == [6, 2]


def test_a_mixed_run_reports_interference(fake_server: Callable, tmp_path: Path) -> None:
    # the long requests (dispatch index 3 and 7) take 0.3 s to their first token
    behaviour = FakeBehaviour(ttft_s=0.01, itl_s=0.01, ttft_overrides_s={3: 0.3, 7: 0.3})
    _server, url = fake_server(behaviour)
    workload = tmp_path / "mix.yaml"
    workload.write_text(json.dumps({"workload": MIX, "arrivals": {"num_requests": 8}}))
    args = ["bench", "--base-url", url, "--workload", str(workload), "--no-progress"]
    args += ["--save-result", "--result-dir", str(tmp_path), "--result-filename", "r.json"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Short requests around long prompts" in result.output
    summary = json.loads((tmp_path / "r.json").read_text())
    interference = summary["interference"]
    assert interference["long_completed"] == 2 and interference["short_completed"] == 6
    assert interference["short_all"]["num_ttft_samples"] == 6
    assert (tmp_path / "r.interference.png").stat().st_size > 0
    assert "short_during_long_prefill" in (tmp_path / "r.md").read_text()
