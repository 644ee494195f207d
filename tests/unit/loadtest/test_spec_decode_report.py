"""``pdserve bench`` reports the server's mean acceptance length when it speculates."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from loadtest.fault_schedule import parse_counters
from loadtest.spec_decode_report import spec_decode_summary
from loadtest.terminal_view import summary_table
from tests.unit.loadtest.fake_server import FakeBehaviour


def _metrics(drafts: int, draft_tokens: int, accepted: int, per_pos: tuple[int, ...]) -> str:
    """A /metrics text as the ingress exposes it: two decode replicas, the counts split."""
    lines = []
    for name, value in (
        ("num_drafts", drafts),
        ("num_draft_tokens", draft_tokens),
        ("num_accepted_tokens", accepted),
    ):
        family = f"pdserve:spec_decode_{name}"
        lines += [f"# HELP {family} x", f"# TYPE {family} counter"]
        for replica, share in (("a", value - value // 2), ("b", value // 2)):
            lines.append(f'{family}_total{{pool="decode",replica="{replica}"}} {share}')
    family = "pdserve:spec_decode_num_accepted_tokens_per_pos"
    lines += [f"# HELP {family} x", f"# TYPE {family} counter"]
    for position, count in enumerate(per_pos):
        lines.append(f'{family}_total{{pool="decode",position="{position}",replica="a"}} {count}')
    return "\n".join(lines) + "\n"


def test_the_runs_acceptance_is_the_counters_difference() -> None:
    before = parse_counters(_metrics(10, 40, 12, (8, 4)))
    after = parse_counters(_metrics(30, 110, 52, (24, 16, 8, 4)))
    summary = spec_decode_summary(before, after)
    assert summary["spec_decode_acceptance_length"] == pytest.approx(1 + 40 / 20)
    assert summary["spec_decode_acceptance_rate"] == pytest.approx(40 / 70)
    assert summary["spec_decode_num_drafts"] == 20
    assert summary["spec_decode_num_draft_tokens"] == 70
    assert summary["spec_decode_num_accepted_tokens"] == 40
    assert summary["spec_decode_per_position_acceptance_rates"] == pytest.approx(
        [16 / 20, 12 / 20, 8 / 20, 4 / 20]
    )


def test_no_keys_when_the_server_did_not_speculate() -> None:
    same = parse_counters(_metrics(10, 40, 12, (8, 4)))
    assert spec_decode_summary(same, same) == {}
    assert spec_decode_summary({}, {}) == {}


def test_a_bench_run_reads_the_counters_around_it(
    fake_server: Callable, run_bench: Callable
) -> None:
    reads: list[int] = []

    def metrics() -> str:
        reads.append(1)
        return _metrics(5, 20, 6, (4, 2)) if len(reads) == 1 else _metrics(9, 36, 14, (7, 5, 2))

    _server, url = fake_server(FakeBehaviour(metrics_text=metrics))
    out = run_bench(url, arrivals={"num_requests": 4})
    assert out.summary["completed"] == 4
    assert out.summary["spec_decode_acceptance_length"] == pytest.approx(1 + 8 / 4)
    assert out.summary["spec_decode_num_drafts"] == 4
    assert len(reads) == 2


def test_a_server_without_metrics_adds_no_key(fake_server: Callable, run_bench: Callable) -> None:
    server, url = fake_server(FakeBehaviour())
    out = run_bench(url, arrivals={"num_requests": 2})
    assert out.summary["completed"] == 2
    assert not any(key.startswith("spec_decode") for key in out.summary)
    assert len(server.received) == 2  # the /metrics reads are not requests


def test_the_terminal_summary_shows_the_acceptance_length_only_when_measured() -> None:
    with_spec = summary_table({"label": "x", "spec_decode_acceptance_length": 2.5})
    without = summary_table({"label": "x"})
    assert "spec_decode_acceptance_length" in with_spec.columns[0]._cells
    assert "2.50" in with_spec.columns[1]._cells
    assert "spec_decode_acceptance_length" not in without.columns[0]._cells
