"""Result files of a run: summary JSON (vLLM's layout), per-request JSONL, Markdown summary.

File names follow ``vllm bench serve``: ``{label}-{rate}qps[-concurrency{N}]-{model}-{date}.json``
unless ``--result-filename`` is given; the JSONL, Markdown and PNG files share that stem
(``stem.requests.jsonl``, ``stem.md``, ``stem.ttft_vs_input.png`` ...).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loadtest.failures import reason_label
from loadtest.summary import METRIC_NAMES
from loadtest.types import THROUGHPUT_KEYS, RequestRecord

_METRIC_TITLES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2EL"}


def default_filename(summary: dict[str, Any]) -> str:
    """vLLM's default result file name for this summary."""
    concurrency = summary.get("max_concurrency")
    concurrency_part = f"-concurrency{concurrency}" if concurrency is not None else ""
    model = str(summary.get("model_id", "model")).rstrip("/").split("/")[-1]
    rate = summary.get("request_rate", "inf")
    label = summary.get("label", "bench")
    return f"{label}-{rate}qps{concurrency_part}-{model}-{summary['date']}.json"


def sweep_stem(summary: dict[str, Any]) -> str:
    """Default stem of a sweep's files: ``{label}-sweep-{model}-{date}``."""
    model = str(summary.get("model_id", "model")).rstrip("/").split("/")[-1]
    return f"{summary.get('label', 'bench')}-sweep-{model}-{summary['date']}"


def result_path(
    summary: dict[str, Any], result_dir: str | None, result_filename: str | None
) -> Path:
    """Where the summary JSON goes (the directory is created)."""
    directory = Path(result_dir or ".")
    directory.mkdir(parents=True, exist_ok=True)
    return directory / (result_filename or default_filename(summary))


def sibling(json_path: Path, suffix: str) -> Path:
    """``run.json`` + ``.requests.jsonl`` -> ``run.requests.jsonl``."""
    return json_path.with_name(json_path.stem + suffix)


def record_to_dict(record: RequestRecord) -> dict[str, Any]:
    """One JSONL line: every field, times in seconds, the failure kind as its string."""
    data = asdict(record)
    data["failure_kind"] = record.failure_kind.value if record.failure_kind else None
    data["itl_s"] = list(record.itl_s)
    data["tpot_s"] = record.tpot_s
    return data


def detailed_fields(records: Sequence[RequestRecord]) -> dict[str, list[Any]]:
    """vLLM's ``--save-detailed`` per-request lists."""
    return {
        "input_lens": [r.prompt_tokens for r in records],
        "output_lens": [r.output_tokens for r in records],
        "ttfts": [r.ttft_s for r in records],
        "itls": [list(r.itl_s) for r in records],
        "latencies": [r.latency_s for r in records],
        "start_times": [r.start_s for r in records],
        "errors": [r.error for r in records],
    }


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    """The summary JSON."""
    path.write_text(json.dumps(summary, indent=2) + "\n")


def write_records(path: Path, records: Sequence[RequestRecord]) -> None:
    """One JSON object per request."""
    with path.open("w") as f:
        for record in records:
            f.write(json.dumps(record_to_dict(record)) + "\n")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return "-" if value is None else str(value)


def render_markdown(summary: dict[str, Any]) -> str:
    """A human summary: run settings, throughput, latency percentiles, failures."""
    lines = [f"# Benchmark: {summary.get('label', 'bench')}", ""]
    lines += ["| setting | value |", "|---|---|"]
    for key in ("model_id", "workload", "backend", "request_rate", "burstiness"):
        lines.append(f"| {key} | {_fmt(summary.get(key))} |")
    lines.append(f"| max_concurrency | {_fmt(summary.get('max_concurrency'))} |")
    lines.append(f"| token_counts | {_fmt(summary.get('token_counts'))} |")
    error = summary.get("prompt_token_error_pct")
    if error:
        lines.append(
            f"| prompt token error vs server (%) | mean {error['mean_abs']:.3f}, "
            f"max {error['max_abs']:.3f} over {error['requests']} requests |"
        )
    lines += ["", "| result | value |", "|---|---|"]
    for key in THROUGHPUT_KEYS:
        lines.append(f"| {key} | {_fmt(summary.get(key))} |")
    percentile_keys = sorted(
        {k.split("_")[0] for k in summary if k.startswith("p") and k.endswith("_ms")},
        key=lambda k: float(k[1:]),
    )
    header = ["metric (ms)", "mean", "median", "std", *percentile_keys]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for metric in METRIC_NAMES:
        cells = [summary.get(f"{stat}_{metric}_ms") for stat in ("mean", "median", "std")]
        cells += [summary.get(f"{p}_{metric}_ms") for p in percentile_keys]
        lines.append(f"| {_METRIC_TITLES[metric]} | " + " | ".join(_fmt(c) for c in cells) + " |")
    lines += _interference_lines(summary.get("interference"))
    failures = summary.get("failures_by_kind") or {}
    if failures:
        lines += ["", "| failure kind | requests |", "|---|---|"]
        lines += [f"| {kind} | {count} |" for kind, count in failures.items()]
    reasons = summary.get("failure_reasons") or []
    if reasons:
        lines += ["", "| requests | failed as | message |", "|---|---|---|"]
        lines += [f"| {r['count']} | {reason_label(r)} | {_cell(r['message'])} |" for r in reasons]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _interference_lines(interference: dict[str, Any] | None) -> list[str]:
    """Short requests' TTFT / ITL percentiles during long prefills and outside them."""
    if not interference:
        return []
    sections = ("short_during_long_prefill", "short_outside_long_prefill", "short_all")
    lines = [
        "",
        f"Short requests around long prompts: {interference['long_completed']} of "
        f"{interference['long_requests']} long and {interference['short_completed']} of "
        f"{interference['short_requests']} short requests completed.",
        "",
        "| short requests (ms) | " + " | ".join(sections) + " |",
        "|---|" + "---|" * len(sections),
    ]
    keys = [k for k in interference[sections[0]] if k.endswith("_ms") or k.startswith("num_")]
    for key in keys:
        cells = " | ".join(_fmt(interference[section].get(key)) for section in sections)
        lines.append(f"| {key} | {cells} |")
    return lines
