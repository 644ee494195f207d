"""Every workload YAML shipped in configs/loadtest/ validates against the schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError
from loadtest.config import LoadTestConfig, TraceWorkloadConfig
from loadtest.flags import BenchFlags, build_config

WORKLOAD_DIR = Path(__file__).resolve().parents[3] / "configs" / "loadtest"
WORKLOAD_FILES = sorted(WORKLOAD_DIR.glob("*.yaml"))


def test_the_directory_has_the_documented_workloads() -> None:
    names = {p.stem for p in WORKLOAD_FILES}
    assert {"random-1k", "long-context-32k", "long-context-128k", "shared-prefix"} <= names
    assert {"multi-turn-chat", "mooncake-trace", "concurrency-knee", "long-short-mix"} <= names


@pytest.mark.parametrize("path", WORKLOAD_FILES, ids=lambda p: p.name)
def test_workload_file_is_valid(path: Path) -> None:
    config, base_dir = build_config(BenchFlags(workload=str(path)))
    assert isinstance(config, LoadTestConfig)
    assert base_dir == path.parent
    assert config.name == path.stem


def test_bare_names_and_cli_overrides() -> None:
    config, _ = build_config(
        BenchFlags(workload="long-context-32k", num_prompts=3, request_rate=9.0, model="m")
    )
    assert config.arrivals.num_requests == 3
    assert config.arrivals.request_rate == 9.0
    assert config.arrivals.max_concurrency == 32  # kept from the file
    assert config.target.model == "m"
    trace, _ = build_config(BenchFlags(dataset_name="mooncake-trace", dataset_path="t.jsonl"))
    assert isinstance(trace.workload, TraceWorkloadConfig)
    with pytest.raises(ConfigError, match="follows its timestamps"):
        build_config(BenchFlags(dataset_path="t.jsonl", request_rate=2.0))
    with pytest.raises(ConfigError, match="random workloads only"):
        build_config(BenchFlags(dataset_name="shared-prefix", random_input_len=5))


def test_random_flags_map_to_the_workload() -> None:
    config, _ = build_config(
        BenchFlags(
            random_input_len=300,
            random_output_len=20,
            random_range_ratio=0.1,
            random_prefix_len=50,
            goodput=["ttft:100", "e2el:900"],
        )
    )
    workload = config.workload
    assert workload.kind == "random"
    assert (workload.input_len.tokens, workload.input_len.range_ratio) == (300, 0.1)
    assert (workload.output_len.tokens, workload.prefix_len_tokens) == (20, 50)
    assert config.target.ignore_eos is True  # vLLM's default for random data
    assert (config.slo.ttft_ms, config.slo.tpot_ms, config.slo.e2el_ms) == (100, None, 900)
    plain, _ = build_config(BenchFlags(ignore_eos=False, host="10.0.0.1"))
    assert plain.target.ignore_eos is False
    assert plain.target.base_url == "http://10.0.0.1:8000"


def test_dataset_path_needs_the_trace_dataset() -> None:
    with pytest.raises(ConfigError, match="mooncake-trace"):
        build_config(BenchFlags(dataset_name="random", dataset_path="t.jsonl"))
