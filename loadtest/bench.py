"""One load-test run end to end: config in, records and the vLLM-compatible summary out."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from loadtest.clock import now_s
from loadtest.config import LoadTestConfig
from loadtest.fault_report import fault_report
from loadtest.fault_schedule import FaultSchedule
from loadtest.http_client import OpenAIStreamClient, first_model
from loadtest.server_timing import breakdown_summary
from loadtest.session_driver import OnDone, run_sessions
from loadtest.spec_decode_report import spec_decode_summary
from loadtest.summary import DEFAULT_PERCENTILE_METRICS, summarize
from loadtest.text import TextSynthesizer
from loadtest.token_counter_choice import counting_report
from loadtest.tokens import TokenCounter
from loadtest.types import RequestRecord, Session
from loadtest.workloads import build_sessions, requests_per_session

_CONNECT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class BenchOutput:
    """A finished run: its config, the model it hit, every request, and the summary dict."""

    config: LoadTestConfig
    model: str
    records: tuple[RequestRecord, ...]
    summary: dict[str, Any]


@dataclass(frozen=True)
class ReportOptions:
    """Which percentiles the summary carries (vLLM's --metric-percentiles/--percentile-metrics)."""

    percentiles: tuple[float, ...] = (99.0,)
    percentile_metrics: tuple[str, ...] = DEFAULT_PERCENTILE_METRICS


def prepare_sessions(
    config: LoadTestConfig, counter: TokenCounter, base_dir: Path | None = None
) -> list[Session]:
    """Build every session of the run up front (prompts synthesised and counted)."""
    synth = TextSynthesizer(counter)
    sessions = build_sessions(config.workload, synth, config.arrivals.seed, base_dir)
    return list(itertools.islice(sessions, config.arrivals.num_requests))


def expected_requests(config: LoadTestConfig, num_sessions: int) -> int:
    """Requests the run sends if every turn succeeds and no duration cuts it short."""
    return num_sessions * requests_per_session(config.workload)


def run_settings(config: LoadTestConfig, model: str) -> dict[str, Any]:
    """The run-description fields vLLM writes ahead of the metrics."""
    rate = config.arrivals.request_rate
    chat = config.target.endpoint.rstrip("/").endswith("chat/completions")
    return {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": "openai-chat" if chat else "openai",
        "endpoint_type": "openai-chat" if chat else "openai",
        "label": config.name,
        "model_id": model,
        "workload": config.workload.kind,
        "num_prompts": config.arrivals.num_requests,
        "request_rate": "inf" if math.isinf(rate) else rate,
        "burstiness": config.arrivals.burstiness,
        "max_concurrency": config.arrivals.max_concurrency,
        "duration_limit_s": config.arrivals.duration_s,
        "ramp_up_strategy": config.arrivals.ramp_up_strategy,
        "ramp_up_start_rps": config.arrivals.ramp_up_start_rps,
        "ramp_up_end_rps": config.arrivals.ramp_up_end_rps,
    }


async def run_benchmark(
    config: LoadTestConfig,
    sessions: Sequence[Session],
    counter: TokenCounter,
    *,
    report: ReportOptions | None = None,
    api_key: str | None = None,
    on_done: OnDone | None = None,
) -> BenchOutput:
    """Send ``sessions`` per ``config`` and summarise; the model defaults to the server's first."""
    report = report or ReportOptions()
    target = config.target
    timeout = httpx.Timeout(target.request_timeout_s, connect=_CONNECT_TIMEOUT_S, pool=None)
    keepalive = config.arrivals.max_concurrency or 100
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=keepalive)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        model = target.model or await first_model(http, target.base_url, api_key)
        client = OpenAIStreamClient(http, target, model, api_key)
        schedule = FaultSchedule(http, target.base_url, config.events, config.control, api_key)
        counters_before = await schedule.counters()
        started_s = now_s()
        firing = asyncio.create_task(schedule.run(started_s))
        try:
            result = await run_sessions(
                sessions,
                config.arrivals,
                client,
                counter,
                on_done=on_done,
                start_s=started_s,
            )
        finally:
            firing.cancel()  # events planned after the last request never fire
            await asyncio.gather(firing, return_exceptions=True)
        counters_after = await schedule.counters()
        if config.events:
            await schedule.finish()
    metrics = summarize(
        result.records,
        result.duration_s,
        config.slo,
        percentiles=report.percentiles,
        percentile_metrics=report.percentile_metrics,
    )
    counting = counting_report(result.records, counter)
    summary = {**run_settings(config, model), **counting, **metrics}
    summary |= spec_decode_summary(counters_before, counters_after)
    timings = [r.server_timing for r in result.records if r.server_timing is not None]
    if timings:
        summary["ttft_breakdown"] = breakdown_summary(timings)
    if config.events:
        fired, final = schedule.fired, schedule.final_counters
        summary |= fault_report(fired, final, result.records, config.slo, config.control)
    return BenchOutput(config=config, model=model, records=result.records, summary=summary)
