"""Two models from one deploy, beside the shared app (same proxy, route ``/multi``).

tiny-llama is served colocated (one decode replica), tiny-moe disaggregated (a prefill and a
decode replica). Each answers greedy-identically to its offline ``LLM``; scaling one model's
pools leaves the other's replicas alone; an unknown model is the OpenAI 404; the virtual names
route by rule (``auto``) or by cascade (``careful`` always escalates an unsure answer,
``lenient`` never does), with the routing headers, counters and per-model metrics to show it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cluster.ops.launcher import deploy
from cluster.ops.scaling import scale
from cluster.serve.config_file import load_cluster_config
from core.sampling import SamplingParams
from engine import LLM
from tests.cluster_fixtures import ServingApp, SimCluster, remove_app
from tests.integration.support import engine_section
from tests.waiting import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

APP = "pdserve-multi"
ROUTE = "/multi"
SMALL, LARGE = "tiny-llama", "tiny-moe"
CHECKPOINTS = {SMALL: "builtin:tiny-llama", LARGE: "builtin:tiny-moe"}
SHORT = "Two models, one endpoint."
LONG = "A prompt long enough for the prefill pool and the long-prompt rule. " * 3
MAX_TOKENS = 6


def multi_config(port: int) -> dict[str, Any]:
    pool = {"num_cpus": 0.25, "graceful_shutdown_timeout_s": 10.0}

    def model(served: str) -> dict[str, Any]:
        return {"name": CHECKPOINTS[served], "dtype": "float32", "served_name": served}

    def cascade(min_mean_logprob: float) -> dict[str, Any]:
        return {"escalate_to": LARGE, "on_length": False, "min_mean_logprob": min_mean_logprob}

    return {
        "models": [
            {"model": model(SMALL), "prefill": {"num_replicas": 0}, "decode": pool},
            {"model": model(LARGE), "prefill": pool, "decode": pool},
        ],
        "virtual_models": [
            {
                "name": "auto",
                "default": SMALL,
                "rules": [
                    {"model": LARGE, "name": "long_prompt", "min_prompt_tokens": 128},
                    {"model": LARGE, "name": "hinted", "header": "x-tier", "header_value": "hard"},
                ],
            },
            {"name": "careful", "default": SMALL, "cascade": cascade(-0.001)},
            {"name": "lenient", "default": SMALL, "cascade": cascade(-1000.0)},
        ],
        "engine": engine_section(),
        "disaggregation": {"local_prefill_threshold_tokens": 24},
        "server": {"port": port, "num_cpus": 0.25, "max_in_flight_requests": 16},
        "cluster": {"address": "auto", "app_name": APP, "route_prefix": ROUTE},
    }


@pytest.fixture(scope="module")
def endpoint(serving_app: ServingApp, sim_cluster: SimCluster) -> Iterator[str]:
    config = load_cluster_config(multi_config(serving_app.config.server.port))
    try:
        yield deploy(config, sim_cluster.dashboard_url, timeout_s=300)
    finally:
        remove_app(serving_app, APP)


@pytest.fixture(scope="module")
def reference() -> dict[tuple[str, str], str]:
    """Greedy text of each model's offline engine for each prompt, with the app's options."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    texts = {}
    for served, checkpoint in CHECKPOINTS.items():
        llm = LLM(checkpoint, dtype="float32", **engine_section())
        for prompt, out in zip((SHORT, LONG), llm.generate([SHORT, LONG], params), strict=True):
            texts[served, prompt] = out.text
    return texts


def complete(
    endpoint: str, model: str, prompt: str, headers: dict[str, str] | None = None, **extra: Any
) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True, **extra}  # fmt: skip
    return httpx.post(f"{endpoint}/v1/completions", json=body, headers=headers, timeout=120)


def test_each_model_answers_like_its_offline_llm(
    endpoint: str, reference: dict[tuple[str, str], str]
) -> None:
    listed = {m["id"] for m in httpx.get(f"{endpoint}/v1/models", timeout=30).json()["data"]}
    assert {SMALL, LARGE, "auto", "careful", "lenient"} <= listed
    for served in (SMALL, LARGE):
        for prompt in (SHORT, LONG):
            response = complete(endpoint, served, prompt)
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["model"] == served
            assert body["choices"][0]["text"] == reference[served, prompt], (served, prompt)
    paths = {complete(endpoint, LARGE, "Fresh: " + LONG).json()["usage"]["ttft_breakdown"]["path"]}
    assert paths == {"remote"}  # an uncached long prompt: tiny-moe's own prefill pool


def test_an_unknown_model_is_the_openai_404(endpoint: str) -> None:
    response = complete(endpoint, "tiny-gpt", SHORT)
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["type"] == "not_found_error" and error["param"] == "model"
    assert SMALL in error["message"] and "auto" in error["message"]


def replica_ids(serving_app: ServingApp, deployment: str) -> set[str]:
    app = serving_app.rest.app_details(APP) or {}
    replicas = app.get("deployments", {}).get(deployment, {}).get("replicas", [])
    return {r["replica_id"] for r in replicas if r["state"] == "RUNNING"}


def test_scaling_one_model_leaves_the_other_alone(
    endpoint: str, serving_app: ServingApp, sim_cluster: SimCluster
) -> None:
    small_before = replica_ids(serving_app, "Decode-tiny-llama")
    asked = scale(APP, None, 2, dashboard_url=sim_cluster.dashboard_url, model=LARGE)
    assert asked.replicas == {"Decode-tiny-moe": 2} and asked.app_name == APP
    wait_until(lambda: len(replica_ids(serving_app, "Decode-tiny-moe")) == 2, 180, "2 decode")
    assert replica_ids(serving_app, "Decode-tiny-llama") == small_before
    metrics = httpx.get(f"{endpoint}/metrics", timeout=30).text
    assert 'pdserve:replicas{model_name="tiny-moe",role="decode"} 2.0' in metrics
    assert 'pdserve:replicas{model_name="tiny-llama",role="decode"} 1.0' in metrics
    scale(APP, None, 1, dashboard_url=sim_cluster.dashboard_url, model=LARGE)
    wait_until(lambda: len(replica_ids(serving_app, "Decode-tiny-moe")) == 1, 180, "1 decode")
    assert replica_ids(serving_app, "Decode-tiny-llama") == small_before


def test_auto_routes_by_rule(endpoint: str, reference: dict[tuple[str, str], str]) -> None:
    cases = [
        (SHORT, {}, SMALL, "default"),
        (LONG, {}, LARGE, "long_prompt"),
        (SHORT, {"x-tier": "hard"}, LARGE, "hinted"),
    ]
    for prompt, headers, model, reason in cases:
        response = complete(endpoint, "auto", prompt, headers=headers)
        assert response.json()["model"] == model
        assert response.json()["choices"][0]["text"] == reference[model, prompt]
        assert response.headers["x-pdserve-routed-model"] == model
        assert response.headers["x-pdserve-route-reason"] == reason
    metrics = httpx.get(f"{endpoint}/metrics", timeout=30).text
    labels = f'model_name="{LARGE}",reason="hinted",virtual_model="auto"'
    assert f"pdserve:model_routing_decisions_total{{{labels}}} 1.0" in metrics


def test_a_cascade_escalates_an_unsure_answer_and_keeps_a_sure_one(
    endpoint: str, reference: dict[tuple[str, str], str]
) -> None:
    escalated = complete(endpoint, "careful", SHORT)
    assert escalated.json()["model"] == LARGE
    assert escalated.json()["choices"][0]["text"] == reference[LARGE, SHORT]
    assert escalated.headers["x-pdserve-route-reason"] == "escalated_low_logprob"
    spent = escalated.headers["x-pdserve-cascade-usage"]
    assert spent.startswith(f"model={SMALL}; ") and f"completion_tokens={MAX_TOKENS}" in spent
    kept = complete(endpoint, "lenient", SHORT, stream=True)
    events = [line[6:] for line in kept.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and kept.headers["x-pdserve-route-reason"] == "cascade_accepted"
    chunks = [httpx.Response(200, content=e).json() for e in events[:-1]]
    assert {c["model"] for c in chunks} == {SMALL}
    assert "".join(c["choices"][0]["text"] for c in chunks) == reference[SMALL, SHORT]
    assert all(c["choices"][0]["logprobs"] is None for c in chunks)  # forced ones removed
