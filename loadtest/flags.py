"""From ``pdserve bench`` flags (and an optional workload YAML) to one ``LoadTestConfig``.

Precedence: built-in defaults < the ``--workload`` YAML < flags given on the command line
(flags left unset are ``None`` and change nothing). ``--dataset-name`` replaces the YAML's
workload; the ``--random-*`` flags then tune a random-kind workload (random, long-32k,
long-128k). As ``vllm bench serve`` does, random workloads (and the long-short mix) send
``ignore_eos`` unless ``--no-ignore-eos`` (or the YAML) says otherwise, so outputs run to their
requested length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.config.files import REPO_CONFIGS, read_yaml_mapping, resolve_yaml, validate_mapping
from core.errors import ConfigError
from loadtest.config import LoadTestConfig
from loadtest.workload_presets import preset_workload

_SLO_NAMES = ("ttft", "tpot", "e2el")


@dataclass(frozen=True)
class BenchFlags:
    """Every config-shaping flag of ``pdserve bench``; ``None`` means "not given"."""

    workload: str | None = None
    label: str | None = None
    base_url: str | None = None
    host: str | None = None
    port: int | None = None
    endpoint: str | None = None
    model: str | None = None
    tokenizer: str | None = None
    ignore_eos: bool | None = None
    temperature: float | None = None
    request_timeout_s: float | None = None
    dataset_name: str | None = None
    dataset_path: str | None = None
    random_input_len: int | None = None
    random_output_len: int | None = None
    random_range_ratio: float | None = None
    random_prefix_len: int | None = None
    num_prompts: int | None = None
    seed: int | None = None
    request_rate: float | None = None
    burstiness: float | None = None
    max_concurrency: int | None = None
    duration_s: float | None = None
    ramp_up_strategy: str | None = None
    ramp_up_start_rps: float | None = None
    ramp_up_end_rps: float | None = None
    goodput: list[str] = field(default_factory=list)
    sweep: str | None = None
    sweep_values: str | None = None
    sweep_max_steps: int | None = None
    sweep_min_gain: float | None = None


def resolve_workload_path(name: str) -> Path:
    """A YAML path, or a bare name of a file in the repo's ``configs/loadtest/``."""
    return resolve_yaml(name, REPO_CONFIGS / "loadtest", kind="workload", param="workload")


def validate(data: dict[str, Any], source: str) -> LoadTestConfig:
    """``LoadTestConfig`` from a dict, pydantic errors folded into one readable ConfigError."""
    return validate_mapping(LoadTestConfig, data, kind="load-test config", source=source)


def parse_goodput(items: list[str]) -> dict[str, float]:
    """``["ttft:500", "tpot:50 e2el:2000"]`` -> ``{"ttft_ms": 500, ...}`` (vLLM's KEY:VALUE)."""
    slo: dict[str, float] = {}
    for item in (part for text in items for part in text.replace(",", " ").split()):
        name, sep, value = item.partition(":")
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not sep or name not in _SLO_NAMES or number < 0:
            raise ConfigError(
                f"bad --goodput {item!r}: use KEY:MS with KEY in {', '.join(_SLO_NAMES)}",
                param="goodput",
            )
        slo[f"{name}_ms"] = number
    return slo


def _set(section: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        section[key] = value


def _apply_random_flags(workload: dict[str, Any], flags: BenchFlags) -> dict[str, Any]:
    given = (flags.random_input_len, flags.random_output_len, flags.random_prefix_len)
    if all(v is None for v in (*given, flags.random_range_ratio)):
        return workload
    if workload.get("kind", "random") != "random":
        raise ConfigError("--random-* flags apply to random workloads only", param="dataset_name")
    lengths = (
        ("input_len", flags.random_input_len, 1024),
        ("output_len", flags.random_output_len, 128),
    )
    for key, tokens, default_tokens in lengths:
        section = dict(workload.get(key) or {"tokens": default_tokens})
        _set(section, "tokens", tokens)
        _set(section, "range_ratio", flags.random_range_ratio)
        workload[key] = section
    _set(workload, "prefix_len_tokens", flags.random_prefix_len)
    return workload


def _workload(data: dict[str, Any], flags: BenchFlags) -> dict[str, Any]:
    if flags.dataset_name == "mooncake-trace" or (flags.dataset_path and not flags.dataset_name):
        if not flags.dataset_path:
            raise ConfigError("--dataset-name mooncake-trace needs --dataset-path", param="path")
        return {"kind": "mooncake-trace", "path": flags.dataset_path}
    if flags.dataset_path:
        raise ConfigError("--dataset-path goes with --dataset-name mooncake-trace", param="path")
    if flags.dataset_name == "random":
        workload: dict[str, Any] = {"kind": "random"}
    elif flags.dataset_name is not None:
        workload = preset_workload(flags.dataset_name)
    else:
        workload = dict(data.get("workload") or {"kind": "random"})
    return _apply_random_flags(workload, flags)


def _target(data: dict[str, Any], flags: BenchFlags, workload_kind: str) -> dict[str, Any]:
    target = dict(data.get("target") or {})
    base_url = flags.base_url
    if base_url is None and (flags.host is not None or flags.port is not None):
        base_url = f"http://{flags.host or '127.0.0.1'}:{flags.port or 8000}"
    for key, value in (
        ("base_url", base_url),
        ("endpoint", flags.endpoint),
        ("model", flags.model),
        ("tokenizer", flags.tokenizer),
        ("temperature", flags.temperature),
        ("request_timeout_s", flags.request_timeout_s),
        ("ignore_eos", flags.ignore_eos),
    ):
        _set(target, key, value)
    if workload_kind in ("random", "long-short-mix"):
        target.setdefault("ignore_eos", True)
    return target


def _arrivals(data: dict[str, Any], flags: BenchFlags) -> dict[str, Any]:
    arrivals = dict(data.get("arrivals") or {})
    for key, value in (
        ("request_rate", flags.request_rate),
        ("burstiness", flags.burstiness),
        ("max_concurrency", flags.max_concurrency),
        ("num_requests", flags.num_prompts),
        ("duration_s", flags.duration_s),
        ("ramp_up_strategy", flags.ramp_up_strategy),
        ("ramp_up_start_rps", flags.ramp_up_start_rps),
        ("ramp_up_end_rps", flags.ramp_up_end_rps),
        ("seed", flags.seed),
    ):
        _set(arrivals, key, value)
    return arrivals


def _sweep(data: dict[str, Any], flags: BenchFlags) -> dict[str, Any] | None:
    sweep_flags = (flags.sweep, flags.sweep_values, flags.sweep_max_steps, flags.sweep_min_gain)
    if all(v is None for v in sweep_flags):
        return data.get("sweep")
    sweep = dict(data.get("sweep") or {})
    _set(sweep, "mode", flags.sweep)
    if flags.sweep_values is not None:
        try:
            sweep["values"] = [float(v) for v in flags.sweep_values.split(",") if v.strip()]
        except ValueError as e:
            raise ConfigError(f"bad --sweep-values {flags.sweep_values!r}", param="sweep") from e
    _set(sweep, "max_steps", flags.sweep_max_steps)
    _set(sweep, "min_gain", flags.sweep_min_gain)
    return sweep


def build_config(flags: BenchFlags) -> tuple[LoadTestConfig, Path | None]:
    """The run's config and the directory relative trace paths resolve against."""
    data: dict[str, Any] = {}
    base_dir = None
    if flags.workload:
        path = resolve_workload_path(flags.workload)
        data, base_dir = read_yaml_mapping(path, kind="workload", param="workload"), path.parent
    workload = _workload(data, flags)
    merged = {
        **data,
        "target": _target(data, flags, str(workload.get("kind", "random"))),
        "workload": workload,
        "arrivals": _arrivals(data, flags),
        "slo": {**(data.get("slo") or {}), **parse_goodput(flags.goodput)},
        "sweep": _sweep(data, flags),
    }
    _set(merged, "name", flags.label)
    return validate(merged, flags.workload or "command line"), base_dir
