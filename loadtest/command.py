"""The body of ``pdserve bench``: build the config, run (or sweep), print, write result files."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console

from core.console import print_error
from core.errors import ConfigError, UnavailableError
from loadtest.bench import (
    BenchOutput,
    ReportOptions,
    expected_requests,
    prepare_sessions,
    run_benchmark,
)
from loadtest.config import LoadTestConfig
from loadtest.flags import BenchFlags, build_config
from loadtest.preflight import ServedModel, check_fits, list_models, pick_model
from loadtest.result_files import (
    detailed_fields,
    render_markdown,
    result_path,
    sibling,
    sweep_stem,
    write_records,
    write_summary,
)
from loadtest.server_tokens import ServerTokenCounter
from loadtest.summary import METRIC_NAMES
from loadtest.sweep import SweepResult, run_sweep
from loadtest.terminal_view import (
    BenchProgress,
    failure_lines,
    interference_table,
    summary_table,
    sweep_table,
)
from loadtest.token_counter_choice import choose_counter
from loadtest.tokens import TokenCounter
from loadtest.types import Session

_PROBE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class OutputOptions:
    """Flags that shape reporting and the checks before the run, not the load."""

    save_result: bool = False
    save_detailed: bool = False
    result_dir: str | None = None
    result_filename: str | None = None
    plots: bool = True
    progress: bool = True
    percentile_metrics: str | None = None
    metric_percentiles: str = "99"
    api_key: str | None = None
    preflight: bool = True


def report_options(out: OutputOptions) -> ReportOptions:
    """Parse ``--percentile-metrics`` / ``--metric-percentiles`` (vLLM's comma lists)."""
    metrics = tuple(
        m.strip() for m in (out.percentile_metrics or ",".join(METRIC_NAMES)).split(",")
    )
    unknown = [m for m in metrics if m not in METRIC_NAMES]
    if unknown:
        raise ConfigError(
            f"unknown --percentile-metrics {unknown}; choose from {', '.join(METRIC_NAMES)}",
            param="percentile_metrics",
        )
    try:
        percentiles = tuple(float(p) for p in out.metric_percentiles.split(",") if p.strip())
    except ValueError as e:
        raise ConfigError(f"bad --metric-percentiles {out.metric_percentiles!r}") from e
    if not percentiles or any(not 0.0 < p <= 100.0 for p in percentiles):
        raise ConfigError("--metric-percentiles must be in (0, 100]", param="metric_percentiles")
    return ReportOptions(percentiles=percentiles, percentile_metrics=metrics)


def save_run(output: BenchOutput, out: OutputOptions, filename: str | None = None) -> list[Path]:
    """Write the summary JSON, per-request JSONL, Markdown and (optionally) PNG plots."""
    summary = dict(output.summary)
    if out.save_detailed:
        summary.update(detailed_fields(output.records))
    json_path = result_path(summary, out.result_dir, filename or out.result_filename)
    write_summary(json_path, summary)
    paths = [json_path, sibling(json_path, ".requests.jsonl"), sibling(json_path, ".md")]
    write_records(paths[1], output.records)
    paths[2].write_text(render_markdown(output.summary))
    if out.plots:
        from loadtest.plots import write_plots

        paths += write_plots(output.records, json_path.with_suffix(""))
    return paths


def _save_sweep(result: SweepResult, out: OutputOptions) -> list[Path]:
    first = result.outputs[0].summary
    stem = Path(out.result_filename).stem if out.result_filename else sweep_stem(first)
    paths: list[Path] = []
    for load, output in zip(result.loads, result.outputs, strict=True):
        paths += save_run(output, out, f"{stem}-{result.mode}{load:g}.json")
    sweep_path = paths[0].with_name(f"{stem}.sweep.json")  # next to the level files
    sweep_path.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    paths.append(sweep_path)
    if out.plots:
        from loadtest.plots import write_sweep_plot

        paths.append(write_sweep_plot(result.to_dict(), sweep_path.with_suffix(".png")))
    return paths


def _total(config: LoadTestConfig, num_sessions: int) -> int | None:
    return None if config.arrivals.duration_s else expected_requests(config, num_sessions)


def _served_model(
    config: LoadTestConfig, http: httpx.Client, api_key: str | None, err: Console
) -> ServedModel:
    """The model to send (``--model`` or the server's first) and its ``max_model_len``."""
    try:
        models = list_models(http, config.target.base_url, api_key)
    except UnavailableError as e:
        if config.target.model is None:
            raise UnavailableError(f"{e.message}; pass --model") from e
        err.print(f"warning: {e.message}: no preflight check", highlight=False)
        return ServedModel(config.target.model, None)
    return pick_model(models, config.target.model)


def execute(flags: BenchFlags, out: OutputOptions) -> int:
    """Run ``pdserve bench``; the exit code is 1 when no request succeeded, else 0."""
    config, base_dir = build_config(flags)
    report = report_options(out)
    console, err = Console(soft_wrap=True), Console(stderr=True, soft_wrap=True)
    with httpx.Client(timeout=_PROBE_TIMEOUT_S) as http:
        served = _served_model(config, http, out.api_key, err)
        target = config.target.model_copy(update={"model": served.model_id})
        config = config.model_copy(update={"target": target})
        counter = choose_counter(
            config, served.model_id, http, api_key=out.api_key, max_model_len=served.max_model_len
        )
        err.print(
            f"preparing {config.arrivals.num_requests} sessions (token counts: {counter.mode}, "
            f"{counter.name})",
            highlight=False,
        )
        sessions = prepare_sessions(config, counter, base_dir)
        limit = served.max_model_len
        if limit is None and isinstance(counter, ServerTokenCounter):
            limit = counter.max_model_len  # /tokenize reports it too
        if out.preflight and limit is not None:
            check_fits(sessions, counter, served.model_id, limit)
        elif out.preflight:
            err.print("warning: the server reports no max_model_len: no preflight check")
        outputs, sweep = _run(config, sessions, counter, report, out, err)
    return _finish(outputs, sweep, out, console, err)


def _run(
    config: LoadTestConfig,
    sessions: list[Session],
    counter: TokenCounter,
    report: ReportOptions,
    out: OutputOptions,
    err: Console,
) -> tuple[list[BenchOutput], SweepResult | None]:
    with BenchProgress(out.progress, err) as progress:
        progress.start_run(_total(config, len(sessions)))
        if config.sweep is None:
            output = asyncio.run(
                run_benchmark(
                    config,
                    sessions,
                    counter,
                    report=report,
                    api_key=out.api_key,
                    on_done=progress.on_done,
                )
            )
            return [output], None
        sweep = asyncio.run(
            run_sweep(
                config,
                config.sweep,
                sessions,
                counter,
                report=report,
                api_key=out.api_key,
                on_done=progress.on_done,
                on_level=lambda _load, _out: progress.start_run(_total(config, len(sessions))),
            )
        )
        return list(sweep.outputs), sweep


def _finish(
    outputs: list[BenchOutput],
    sweep: SweepResult | None,
    out: OutputOptions,
    console: Console,
    err: Console,
) -> int:
    for output in outputs:
        console.print(summary_table(output.summary))
        if "interference" in output.summary:
            console.print(interference_table(output.summary["interference"]))
        lines = failure_lines(output.summary)
        if lines:
            console.print("[bold]failed requests by reason:[/]")
            for line in lines:
                console.print(f"  {line}", highlight=False, markup=False)
    paths: list[Path] = []
    if sweep is not None:
        console.print(sweep_table(sweep.to_dict()))
        paths = _save_sweep(sweep, out) if out.save_result else []
    elif out.save_result:
        paths = save_run(outputs[0], out)
    for path in paths:
        console.print(f"wrote {path}", highlight=False)
    if sum(o.summary["completed"] for o in outputs) == 0:
        failed = sum(o.summary["failed"] for o in outputs)
        print_error(f"no request succeeded ({failed} failed; reasons above)")
        return 1
    return 0
