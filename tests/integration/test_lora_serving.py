"""A LoRA adapter loaded at run time, served through P/D: ``/v1/load_lora_adapter`` reaches the
prefill and the decode replica, a request naming the adapter prefills remotely and decodes under
it with the offline ``LLM``'s greedy text under the same adapter, ``/v1/models`` lists it with
its base as parent, and once unloaded the name is the OpenAI 404. Another ingress's view (the
admin the ingress deployment builds, over the app's stats board) sees the load and the unload.
The adapter is made with peft over the built-in tiny Llama, in a temporary directory."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ray import serve
from transformers import LlamaForCausalLM

from cluster.ingress.lora_adapters import ServedAdapter, ServedAdapters
from cluster.ops.launcher import deploy
from cluster.serve.config_file import load_cluster_config
from cluster.serve.ingress_deployment import lora_admin
from cluster.serve.pool_options import BOARD_DEPLOYMENT
from core.sampling import SamplingParams
from engine import LLM, LoRARequest
from engine.builtin.resolve import resolve_model
from tests.cluster_fixtures import ServingApp, SimCluster, remove_app
from tests.integration.support import engine_section
from tests.unit.engine.lora.peft_adapters import make_adapter

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

APP, ROUTE = "pdserve-lora", "/lora"
CHECKPOINT, BASE = "builtin:tiny-llama", "tiny-llama"
PROMPT = "An adapter changes what the tiny model says next, token by token."
MAX_TOKENS = 6
LORA: dict[str, Any] = {"enable_lora": True, "max_loras": 2, "max_lora_rank": 8}


def lora_config(port: int) -> dict[str, Any]:
    pool = {"num_cpus": 0.25, "graceful_shutdown_timeout_s": 10.0}
    return {
        "model": {"name": CHECKPOINT, "dtype": "float32", "served_name": BASE},
        "prefill": pool,
        "decode": pool,
        "engine": {**engine_section(), **LORA},
        "disaggregation": {"local_prefill_threshold_tokens": 4},
        "server": {"port": port, "num_cpus": 0.25},
        "cluster": {"address": "auto", "app_name": APP, "route_prefix": ROUTE},
    }


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = LlamaForCausalLM.from_pretrained(str(resolve_model(CHECKPOINT)))
    return make_adapter(base, tmp_path_factory.mktemp("lora") / "sql", seed=3, rank=8).path


@pytest.fixture(scope="module")
def endpoint(serving_app: ServingApp, sim_cluster: SimCluster) -> Iterator[str]:
    config = load_cluster_config(lora_config(serving_app.config.server.port))
    try:
        yield deploy(config, sim_cluster.dashboard_url, timeout_s=300)
    finally:
        remove_app(serving_app, APP)


def other_ingress_view(port: int) -> ServedAdapters:
    """What another ingress replica of the app reads: the registry on its stats board."""
    admin = lora_admin(
        serve.get_deployment_handle(BOARD_DEPLOYMENT, APP), load_cluster_config(lora_config(port))
    )
    return ServedAdapters(registry=admin)


def seen_by(view: ServedAdapters, name: str) -> ServedAdapter | None:
    asyncio.run(view.sync(name))
    return view.find(name)


def complete(endpoint: str, model: str) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    return httpx.post(f"{endpoint}/v1/completions", json=body, timeout=120)


def test_load_serve_through_pd_list_unload(
    endpoint: str, adapter_dir: Path, serving_app: ServingApp
) -> None:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    llm = LLM(CHECKPOINT, dtype="float32", **engine_section(), **LORA)
    lora = LoRARequest("sql", 1, str(adapter_dir))
    (adapted,) = llm.generate([PROMPT], params, lora_request=lora, use_tqdm=False)
    (plain,) = llm.generate([PROMPT], params, use_tqdm=False)
    assert adapted.text != plain.text  # the adapter changes the output

    body = {"lora_name": "sql", "lora_path": str(adapter_dir)}
    loaded = httpx.post(f"{endpoint}/v1/load_lora_adapter", json=body, timeout=120)
    assert loaded.status_code == 200, loaded.text
    other = other_ingress_view(serving_app.config.server.port)
    assert seen_by(other, "sql") == ServedAdapter("sql", BASE, str(adapter_dir))
    listed = {m["id"]: m for m in httpx.get(f"{endpoint}/v1/models", timeout=30).json()["data"]}
    assert listed["sql"]["parent"] == BASE and listed["sql"]["root"] == str(adapter_dir)
    answer = complete(endpoint, "sql")
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"] == adapted.text
    assert answer.json()["usage"]["ttft_breakdown"]["path"] == "remote"
    assert complete(endpoint, BASE).json()["choices"][0]["text"] == plain.text

    unload = {"lora_name": "sql"}
    unloaded = httpx.post(f"{endpoint}/v1/unload_lora_adapter", json=unload, timeout=120)
    assert unloaded.status_code == 200, unloaded.text
    gone = complete(endpoint, "sql")
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "model"
    assert seen_by(other, "sql") is None
