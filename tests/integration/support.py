"""Helpers shared by the integration tests: waiting on conditions, ports, the test config."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from cluster.ops import process_tree
from cluster.serve.config_file import REPO_CONFIGS
from core.builtin_models import builtin_name

T = TypeVar("T")

PREFILL_LABEL = {"pdserve.io/pool": "prefill"}
"""Node label of the simulated prefill nodes (the prefill pool selects it)."""
DECODE_RESOURCE = "decode_node"
"""Custom resource of the simulated decode nodes (the decode pool claims a bit of it)."""
APP_NAME = "pdserve-test"
MODEL = "builtin:tiny-moe"
SERVED_NAME = "tiny-moe"
MAX_MODEL_LEN = 2048
KV_BYTES = 16 * 1024 * 1024
BATCHED_TOKENS = 256
THRESHOLD_TOKENS = 24
"""Prompts shorter than this prefill locally on decode; longer ones go to the prefill pool."""
EVAL_PYTHON = Path(__file__).resolve().parents[2] / ".venv-eval" / "bin" / "python"
"""lm-evaluation-harness's venv (``make install-eval``): lm-eval brings pandas, which Ray Serve
imports into every replica when it is installed, so the serving venv goes without it."""


def descendant_pids(root_pid: int) -> list[int]:
    """Every running descendant of ``root_pid`` (Linux ``/proc``)."""
    return [process.pid for process in process_tree.descendants(root_pid)]


def processes_running(cmdline_part: str) -> list[tuple[int, int]]:
    """(pid, parent pid) of every running process whose command line holds ``cmdline_part``
    (Linux ``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            continue  # gone meanwhile
        if cmdline_part in cmdline and stat[0] not in "ZXx":
            found.append((int(entry.name), int(stat[1])))
    return found


def is_running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    return process_tree.is_running(pid)


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def engine_section() -> dict[str, Any]:
    """The engine options of the test app (and of the offline reference ``LLM``)."""
    return {
        "max_model_len": MAX_MODEL_LEN,
        "kv_cache_memory_bytes": KV_BYTES,
        "max_num_batched_tokens": BATCHED_TOKENS,
        "max_num_seqs": 8,
    }


BLOCK_BYTES = 32 * 1024
"""One KV block of the test model (tiny-moe, float32, 16 tokens)."""


def app_tiers(disk_path: str) -> dict[str, Any]:
    """KV tiers of the shared app: a two-block host tier written through on completion, so
    every finished prompt's blocks spill on to the disk tier right away."""
    return {
        "host": {"bytes": 2 * BLOCK_BYTES, "write_policy": "write_through"},
        "disk": {"path": disk_path, "bytes": 256 * BLOCK_BYTES},
    }


def app_config(http_port: int, **overrides: Any) -> dict[str, Any]:
    """The cluster config of the shared test app: prefill on label-selected nodes, decode on
    nodes with the decode resource, small KV budgets, a low in-flight cap (for 429s)."""
    config: dict[str, Any] = {
        "model": {"name": MODEL, "dtype": "float32", "served_name": SERVED_NAME},
        "engine": engine_section(),
        "prefill": {
            "num_replicas": 1,
            "num_cpus": 0.5,
            "node_selector": {"labels": PREFILL_LABEL},
            "graceful_shutdown_timeout_s": 10.0,
        },
        "decode": {
            # autoscaling that never triggers: `scale` must turn it into a fixed count in place
            "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 100},
            "num_cpus": 0.5,
            "node_selector": {"resource": DECODE_RESOURCE},
            "graceful_shutdown_timeout_s": 10.0,
        },
        "transfer": {"lease_s": 10.0},
        "disaggregation": {"local_prefill_threshold_tokens": THRESHOLD_TOKENS},
        "server": {
            "port": http_port,
            "num_cpus": 0.25,
            "max_in_flight_requests": 4,
            "retry_after_s": 2.0,
            "prefill_timeout_s": 60.0,
            "chunk_timeout_s": 60.0,
            "fault_injection": True,
        },
        "cluster": {"address": "auto", "app_name": APP_NAME},
    }
    for section, values in overrides.items():
        config[section] = {**config.get(section, {}), **values}
    return config


def repo_config_on_free_ports(
    name: str, directory: Path, edit: Callable[[dict[str, Any]], None] | None = None
) -> tuple[Path, dict[str, str]]:
    """``configs/<name>`` with free HTTP and dashboard ports (and ``edit`` applied), written to
    ``directory``, plus an environment whose run state lives there too."""
    config: dict[str, Any] = yaml.safe_load((REPO_CONFIGS / name).read_text())
    config["server"]["port"] = free_port()
    config["cluster"]["dashboard_port"] = free_port()
    if edit is not None:
        edit(config)
    path = directory / name
    path.write_text(yaml.safe_dump(config))
    cache = directory / "cache"
    seed_model_cache(config["model"]["name"], cache)
    return path, {**os.environ, "PDSERVE_CACHE_DIR": str(cache)}


def seed_model_cache(model: str, cache: Path) -> None:
    """Copy a built-in's directory from the shared cache into the private ``cache`` (a GGUF
    built-in's metadata directory is a tokenizer conversion a run need not repeat)."""
    from engine.builtin import resolve_model

    name = builtin_name(model)
    if name is not None:
        shutil.copytree(resolve_model(model), cache / "models" / name)


def pdserve_cli(
    *args: str, env: dict[str, str] | None = None, timeout_s: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run the ``pdserve`` CLI as a user would (``python -m cluster.ops.cli``)."""
    return subprocess.run(
        [sys.executable, "-m", "cluster.ops.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
