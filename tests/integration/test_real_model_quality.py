"""Quality in numbers on real weights: lm-eval scores pdserve's shipped task
(``benchmarks/lm_eval_tasks/pdserve_basics``: its first 64 of 244 four-way questions here, all of
them in the benchmark run) against ``make serve``'s
configuration (SmolLM2-135M-Instruct through a prefill and a decode replica), and the accuracy
equals what lm-eval's HF backend measures on the same GGUF file — item by item, the same chosen
answers. The app runs next to the shared one (route ``/real``); lm-eval runs in its own venv
(``lm_eval_quality_probe.py``)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.serve.config_file import REPO_CONFIGS, load_cluster_config
from engine.builtin import resolve_model
from engine.builtin.packaged import PACKAGED_MODELS, packaged_file
from tests.cluster_fixtures import ServingApp, side_app
from tests.integration.support import EVAL_PYTHON

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

REAL_APP = "pdserve-real-test"
ROUTE = "/real"
TASK_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "lm_eval_tasks"
PROBE = Path(__file__).with_name("lm_eval_quality_probe.py")
NUM_ITEMS = 64  # of the task's 244: the whole task is the benchmark's figure (docs/benchmarks.md)
MIN_ACCURACY = 0.3  # four choices: chance is 0.25; the model must know some answers


@pytest.fixture(scope="module")
def real_app(serving_app: ServingApp) -> Iterator[tuple[str, str]]:
    """``configs/local.yaml`` (what ``make serve`` runs) next to the shared app: its endpoint
    and served model name."""
    local: dict[str, Any] = yaml.safe_load((REPO_CONFIGS / "local.yaml").read_text())
    local["server"]["port"] = serving_app.config.server.port
    local["cluster"] = {"address": "auto", "app_name": REAL_APP}
    resolve_model(local["model"]["name"])  # its metadata directory, before replicas race for it
    with side_app(serving_app, load_cluster_config(local), ROUTE) as endpoint:
        yield endpoint, local["model"]["served_name"]


def test_lm_eval_accuracy_served_equals_transformers(
    real_app: tuple[str, str], tmp_path: Path
) -> None:
    assert EVAL_PYTHON.exists(), f"{EVAL_PYTHON} is missing: make install-eval creates it"
    endpoint, served_name = real_app
    name = "smollm2-135m-instruct"
    gguf_file = packaged_file(PACKAGED_MODELS[name])
    tokenizer_dir = resolve_model(f"builtin:{name}")
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "datasets"),
           "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": ""}  # fmt: skip
    args = [str(EVAL_PYTHON), str(PROBE), endpoint, served_name, str(tokenizer_dir),
            str(gguf_file), str(TASK_DIR), str(NUM_ITEMS)]  # fmt: skip
    run = subprocess.run(args, check=False, capture_output=True, text=True, env=env,
                         timeout=840, cwd=TASK_DIR)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    served, hf = report["served"], report["hf"]
    print(f"pdserve_basics accuracy: served {served['acc']:.4f}, transformers {hf['acc']:.4f}")
    assert len(served["chosen"]) == len(hf["chosen"]) == NUM_ITEMS
    assert served["chosen"] == hf["chosen"]
    assert served["acc"] == hf["acc"] >= MIN_ACCURACY
