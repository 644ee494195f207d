"""``pdserve up --detach`` / ``status`` / ``down`` on the embedded default (configs/local.yaml),
as a user runs them: a local Ray started by the CLI, the real chat model answering a factual
question through the openai SDK, under 5.5 GiB resident in total (Ray's own processes take about
2 GiB, each replica the model's 0.5 GB of fp32 weights plus its KV), and gone without a trace after
``down`` (no process, no KV segment in ``/dev/shm``).

Quality in numbers on the same real weights, on that same served default (what ``make serve``
runs: SmolLM2-135M-Instruct through a prefill and a decode replica): lm-eval scores pdserve's
shipped task (``benchmarks/lm_eval_tasks/pdserve_basics``: its first 32 of 244 four-way
questions here, all of them in the benchmark run), and the accuracy equals what lm-eval's HF
backend measures on the same GGUF file — item by item, the same chosen answers. lm-eval runs in
its own venv (``lm_eval_quality_probe.py``).

The tests share one ``up --detach`` (module fixture) and run in file order: serving and
status, an upgrade applied in place (no replica restarts; the running routers take the new
policy), then quality, then ``down``; each also passes alone (the fixture starts the app, and
stops it afterwards if no test did).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from cluster.serve.config_file import REPO_CONFIGS
from engine.builtin import resolve_model
from engine.builtin.packaged import PACKAGED_MODELS, packaged_file
from tests.integration.support import (
    EVAL_PYTHON,
    descendant_pids,
    is_running,
    pdserve_cli,
    repo_config_on_free_ports,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

GIB = 1024**3
TASK_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "lm_eval_tasks"
QUALITY_PROBE = Path(__file__).with_name("lm_eval_quality_probe.py")
NUM_ITEMS = 32  # of the task's 244: the whole task is the benchmark's figure (docs/benchmarks.md)
MIN_ACCURACY = 0.3  # four choices: chance is 0.25; the model must know some answers


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


@dataclass(frozen=True)
class DetachedUp:
    """``pdserve up --detach`` of configs/local.yaml on free ports: its config file, the
    environment (a private run-state dir) and what ``up`` printed."""

    path: Path
    env: dict[str, str]
    up: subprocess.CompletedProcess[str]

    def state(self) -> dict[str, Any]:
        """The run state ``up`` recorded (after asserting that ``up`` succeeded)."""
        assert self.up.returncode == 0, self.up.stdout + self.up.stderr
        state: dict[str, Any] = json.loads(run_state_file(self.env).read_text())
        return state

    def served_name(self) -> str:
        """The model name the config serves."""
        return str(yaml.safe_load(self.path.read_text())["model"]["served_name"])


@pytest.fixture(scope="module")
def local_default(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DetachedUp]:
    """configs/local.yaml up (detached) on free ports; stopped afterwards if no test did."""
    path, env = repo_config_on_free_ports("local.yaml", tmp_path_factory.mktemp("local"))
    yield DetachedUp(path, env, pdserve_cli("up", str(path), "--detach", env=env))
    if run_state_file(env).exists():  # no test got to stop it
        pdserve_cli("down", env=env)


def run_state_file(env: dict[str, str]) -> Path:
    """Where ``pdserve up`` records the running app (``down`` clears it)."""
    return Path(env["PDSERVE_CACHE_DIR"]) / "run" / "pdserve.json"


def test_up_detach_serves_the_local_default_and_status_shows_it(
    local_default: DetachedUp,
) -> None:
    state = local_default.state()
    endpoint, owner = state["endpoint"], int(state["owner_pid"])
    assert endpoint in local_default.up.stdout
    env = local_default.env

    client = openai.OpenAI(base_url=f"{endpoint}/v1", api_key="unused", timeout=120)
    chat = client.chat.completions.create(
        model=local_default.served_name(),
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


def replica_ids(env: dict[str, str]) -> set[str]:
    """The ids of every pool replica ``pdserve status`` lists (a restart gives a new id)."""
    status = pdserve_cli("status", "--json", "--no-stats", env=env)
    assert status.returncode == 0, status.stderr
    pools = json.loads(status.stdout)["pools"]
    return {str(r["replica_id"]) for pool in pools for r in pool["replicas"]}


def ingress_start_time(endpoint: str) -> str:
    """The ingress process's ``process_start_time_seconds`` from its ``/metrics``."""
    text = httpx.get(f"{endpoint}/metrics", timeout=30).text
    return next(ln for ln in text.splitlines() if ln.startswith("process_start_time_seconds"))


def model_ids(endpoint: str) -> list[str]:
    """The names ``/v1/models`` lists."""
    return [m["id"] for m in httpx.get(f"{endpoint}/v1/models", timeout=30).json()["data"]]


def routing_policies(endpoint: str) -> set[str]:
    """``pool=policy`` for each pool's router, from the ingress's ``/metrics``."""
    text = httpx.get(f"{endpoint}/metrics", timeout=30).text
    found = re.findall(r'pdserve:routing_policy\{policy="([^"]+)",pool="([^"]+)"\} 1\.0', text)
    return {f"{pool}={policy}" for policy, pool in found}


def test_an_upgrade_of_ingress_fields_applies_in_place_restarting_nothing(
    local_default: DetachedUp, tmp_path: Path
) -> None:
    endpoint, env = local_default.state()["endpoint"], local_default.env
    replicas, started = replica_ids(env), ingress_start_time(endpoint)
    assert "auto" not in model_ids(endpoint)
    config = yaml.safe_load(local_default.path.read_text())
    config["virtual_models"] = [{"name": "auto", "default": local_default.served_name()}]
    config["routing"] = {**config.get("routing", {}), "migration_limit": 1, "policy": "hot_prefix"}
    config["planner"] = {**config.get("planner", {}), "max_step": 3}
    path = tmp_path / "in_place.yaml"
    path.write_text(yaml.safe_dump(config))

    run = pdserve_cli("upgrade", str(path), env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    applied = "routing.policy, routing.migration_limit, planner.max_step, virtual_models"
    assert applied in " ".join(run.stdout.split())  # the console wraps long lines
    wait_until(lambda: "auto" in model_ids(endpoint), 30, "the virtual model to be served")
    assert replica_ids(env) == replicas and ingress_start_time(endpoint) == started
    again = pdserve_cli("upgrade", str(path), env=env)  # the running config includes it now
    assert "nothing to upgrade" in again.stdout, again.stdout + again.stderr
    completion = httpx.post(
        f"{endpoint}/v1/completions",
        json={"model": "auto", "prompt": "The capital of France is", "max_tokens": 4},
        timeout=60,
    )
    assert completion.status_code == 200, completion.text
    assert "decode=hot_prefix" in routing_policies(endpoint)  # the running router took it
    assert ingress_start_time(endpoint) == started


@pytest.mark.timeout(900)
def test_lm_eval_accuracy_served_equals_transformers(
    local_default: DetachedUp, tmp_path: Path
) -> None:
    assert EVAL_PYTHON.exists(), f"{EVAL_PYTHON} is missing: make install-eval creates it"
    endpoint = local_default.state()["endpoint"]
    name = "smollm2-135m-instruct"
    gguf_file = packaged_file(PACKAGED_MODELS[name])
    tokenizer_dir = resolve_model(f"builtin:{name}")
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "datasets"),
           "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": ""}  # fmt: skip
    args = [str(EVAL_PYTHON), str(QUALITY_PROBE), endpoint, local_default.served_name(),
            str(tokenizer_dir), str(gguf_file), str(TASK_DIR), str(NUM_ITEMS)]  # fmt: skip
    run = subprocess.run(args, check=False, capture_output=True, text=True, env=env,
                         timeout=840, cwd=TASK_DIR)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    served, hf = report["served"], report["hf"]
    print(f"pdserve_basics accuracy: served {served['acc']:.4f}, transformers {hf['acc']:.4f}")
    assert len(served["chosen"]) == len(hf["chosen"]) == NUM_ITEMS
    assert served["chosen"] == hf["chosen"]
    assert served["acc"] == hf["acc"] >= MIN_ACCURACY


def test_down_stops_the_detached_up_without_a_trace(local_default: DetachedUp) -> None:
    state = local_default.state()
    endpoint, owner = state["endpoint"], int(state["owner_pid"])
    processes = [owner, *descendant_pids(owner)]
    down = pdserve_cli("down", env=local_default.env)
    assert down.returncode == 0, down.stderr
    wait_until(lambda: not any(is_running(pid) for pid in processes), 60, "processes left")
    assert not run_state_file(local_default.env).exists()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{endpoint}/health", timeout=5)
    # no replica's KV segment is left in /dev/shm
    left = [name for name in os.listdir("/dev/shm") if any(f"-{pid}-" in name for pid in processes)]
    assert not left, left


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
