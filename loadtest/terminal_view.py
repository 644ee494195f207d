"""What ``pdserve bench`` prints: a rich progress bar, the result table, compare/sweep tables."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from loadtest.compare import ComparisonRow
from loadtest.failures import reason_line
from loadtest.summary import METRIC_NAMES
from loadtest.types import THROUGHPUT_KEYS, StreamOutcome


class BenchProgress:
    """A progress bar of finished requests (on stderr); a no-op when disabled."""

    def __init__(self, enabled: bool, console: Console) -> None:
        self._progress = (
            Progress(
                TextColumn("[bold]bench"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[failed]} failed"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            if enabled
            else None
        )
        self._task: TaskID | None = None
        self._failed = 0

    def __enter__(self) -> BenchProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()

    def start_run(self, total: int | None, label: str = "") -> None:
        """Begin a new bar of ``total`` requests (None: unknown, e.g. duration-bound)."""
        if self._progress is not None:
            if self._task is not None:
                self._progress.remove_task(self._task)
            self._failed = 0
            self._task = self._progress.add_task(label, total=total, failed=0)

    def on_done(self, outcome: StreamOutcome) -> None:
        """Advance by one finished request."""
        if self._progress is None or self._task is None:
            return
        self._failed += 0 if outcome.success else 1
        self._progress.update(self._task, advance=1, failed=self._failed)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}"
    return "-" if value is None else str(value)


def summary_table(summary: dict[str, Any]) -> Table:
    """The run's headline numbers and latency statistics."""
    table = Table(title=f"Serving benchmark result: {summary.get('label', '')}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in ("model_id", *THROUGHPUT_KEYS, "max_concurrent_requests"):
        table.add_row(key, _fmt(summary.get(key)))
    for kind, count in (summary.get("failures_by_kind") or {}).items():
        table.add_row(f"failed: {kind}", str(count))
    for metric in METRIC_NAMES:
        for key in sorted(k for k in summary if k.endswith(f"_{metric}_ms")):
            table.add_row(key, _fmt(summary[key]))
    for key in ("spec_decode_acceptance_length", "spec_decode_acceptance_rate"):
        if key in summary:  # the server speculated during the run
            table.add_row(key, _fmt(summary[key]))
    return table


def failure_lines(summary: dict[str, Any]) -> list[str]:
    """``2 × HTTP 400: ...`` per group of failed requests (none when all succeeded)."""
    return [reason_line(reason) for reason in summary.get("failure_reasons") or []]


def interference_table(interference: dict[str, Any]) -> Table:
    """Short requests' TTFT / ITL during long prefills against outside them."""
    table = Table(
        title=(
            f"Short requests around long prompts ({interference['long_completed']} of "
            f"{interference['long_requests']} long completed)"
        )
    )
    sections = ("short_during_long_prefill", "short_outside_long_prefill", "short_all")
    table.add_column("metric")
    for section in sections:
        table.add_column(section.removeprefix("short_").replace("_", " "), justify="right")
    keys = [k for k in interference[sections[0]] if k.endswith("_ms") or k.startswith("num_")]
    for key in keys:
        table.add_row(key, *(_fmt(interference[s].get(key)) for s in sections))
    return table


def compare_table(rows: Sequence[ComparisonRow], name_a: str, name_b: str) -> Table:
    """Two runs side by side with the relative change and the better side."""
    table = Table(title="Benchmark comparison")
    table.add_column("metric")
    table.add_column(f"A: {name_a}", justify="right")
    table.add_column(f"B: {name_b}", justify="right")
    table.add_column("B vs A", justify="right")
    table.add_column("better", justify="center")
    for row in rows:
        change = "-" if row.change_pct is None else f"{row.change_pct:+.1f}%"
        table.add_row(row.metric, _fmt(row.a), _fmt(row.b), change, row.better or "")
    return table


def sweep_table(sweep: dict[str, Any]) -> Table:
    """One row per load level; the knee row is marked."""
    table = Table(title=f"Sweep over {sweep['mode']} ({sweep['throughput_metric']})")
    columns = (
        "load",
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "mean_ttft_ms",
        "mean_tpot_ms",
        "failed",
    )
    for column in (*columns, "knee"):
        table.add_column(column, justify="right")
    for index, level in enumerate(sweep["levels"]):
        knee = "<- knee" if index == sweep["knee_index"] else ""
        table.add_row(*(_fmt(level.get(c)) for c in columns), knee)
    return table
