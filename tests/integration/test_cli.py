"""``pdserve up --detach`` / ``status`` / ``down`` on the embedded default (configs/local.yaml),
as a user runs them: a local Ray started by the CLI, the real chat model answering a factual
question through the openai SDK, under 5.5 GiB resident in total (Ray's own processes take about
2 GiB, each replica the model's 0.5 GB of fp32 weights plus its KV), and gone without a trace after
``down`` (no process, no KV segment in ``/dev/shm``)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from cluster.serve.config_file import REPO_CONFIGS
from tests.integration.support import (
    descendant_pids,
    is_running,
    pdserve_cli,
    repo_config_on_free_ports,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

GIB = 1024**3


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@pytest.fixture
def local_config(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """configs/local.yaml on free ports, and an environment with a private run-state dir."""
    path, env = repo_config_on_free_ports("local.yaml", tmp_path)
    yield path, env
    if run_state_file(env).exists():  # the test did not get to stop it
        pdserve_cli("down", env=env)


def run_state_file(env: dict[str, str]) -> Path:
    """Where ``pdserve up`` records the running app (``down`` clears it)."""
    return Path(env["PDSERVE_CACHE_DIR"]) / "run" / "pdserve.json"


def test_up_detach_status_down_on_the_local_default(
    local_config: tuple[Path, dict[str, str]],
) -> None:
    path, env = local_config
    up = pdserve_cli("up", str(path), "--detach", env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    state_file = run_state_file(env)
    state: dict[str, Any] = json.loads(state_file.read_text())
    endpoint, owner = state["endpoint"], int(state["owner_pid"])
    assert endpoint in up.stdout

    served = yaml.safe_load(path.read_text())["model"]["served_name"]
    client = openai.OpenAI(base_url=f"{endpoint}/v1", api_key="unused", timeout=120)
    chat = client.chat.completions.create(
        model=served,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=32,
        temperature=0.0,
    )
    assert "Paris" in (chat.choices[0].message.content or ""), chat  # real weights answer

    processes = [owner, *descendant_pids(owner)]
    total_rss = sum(rss_bytes(pid) for pid in processes)
    assert total_rss < 5.5 * GIB, (
        f"{total_rss / GIB:.2f} GiB resident over {len(processes)} processes"
    )

    status = pdserve_cli("status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    pools = {p["pool"]: p for p in json.loads(status.stdout)["pools"]}
    for name in ("Prefill", "Decode"):
        (replica,) = pools[name]["replicas"]
        assert replica["state"] == "RUNNING"
        assert replica["stats"]["kv_blocks_total"] > 0

    table = pdserve_cli("status", env={**env, "COLUMNS": "80"})
    assert table.returncode == 0, table.stderr
    assert "INFO" not in table.stdout + table.stderr  # Ray's log lines stay in Ray's own logs
    assert "…" not in table.stdout and all(len(ln) <= 80 for ln in table.stdout.splitlines())
    assert "Prefill (1/1)" in table.stdout and "Decode (1/1)" in table.stdout

    down = pdserve_cli("down", env=env)
    assert down.returncode == 0, down.stderr
    wait_until(lambda: not any(is_running(pid) for pid in processes), 60, "processes left")
    assert not state_file.exists()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{endpoint}/health", timeout=5)
    # every replica unlinked its own KV segment on the way out: none is left, none needed sweeping
    left = [name for name in os.listdir("/dev/shm") if any(f"-{pid}-" in name for pid in processes)]
    assert not left, left
    log = (state_file.parent / "pdserve.log").read_text()
    assert "shared KV segments left by dead processes" not in log, log[-2000:]


def test_validate_reports_field_errors(tmp_path: Path) -> None:
    env = {**os.environ, "PDSERVE_CACHE_DIR": str(tmp_path)}
    ok = pdserve_cli("validate", str(REPO_CONFIGS / "local.yaml"), env=env)
    assert ok.returncode == 0 and "ok" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {name: builtin:tiny-moe}\ndecode: {num_replicas: 1, gpus: 2}\n")
    result = pdserve_cli("validate", str(bad), env=env)
    assert result.returncode == 2
    assert "decode.gpus" in result.stderr


TWO_MODELS = """
models:
  - model: {name: "builtin:tiny-llama", served_name: small}
  - model: {name: "builtin:tiny-moe", served_name: SECOND}
virtual_models:
  - {name: auto, default: small, rules: [{model: TARGET, min_prompt_tokens: 100}]}
"""


@pytest.mark.parametrize(
    ("second", "target", "field"),
    [
        ("small", "small", "models[1].model.served_name: 'small' is already the name"),
        ("large", "huge", "virtual_models[0].rules[0].model: no served model is named 'huge'"),
    ],
)
def test_validate_names_the_field_of_a_bad_model_list(
    tmp_path: Path, second: str, target: str, field: str
) -> None:
    env = {**os.environ, "PDSERVE_CACHE_DIR": str(tmp_path)}
    ok = pdserve_cli("validate", str(REPO_CONFIGS / "local-multi-model.yaml"), env=env)
    assert ok.returncode == 0 and "virtual model auto" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(TWO_MODELS.replace("SECOND", second).replace("TARGET", target))
    result = pdserve_cli("validate", str(bad), env=env)
    assert result.returncode == 2
    assert field in " ".join(result.stderr.split()), result.stderr
