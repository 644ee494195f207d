"""An expert-parallel decode pool (``expert_parallel: 2``) as a Serve gang, in its own app.

The app shares the cluster and HTTP proxy with the shared app but lives under ``/ep`` and is
removed at the end. Through the OpenAI API its greedy output equals the offline engine's; its
two decode replicas form one gang (ranks 0 and 1) reporting expert load; killing one rank
restarts the whole gang, every in-flight request ends within a bound (done, or a clean error),
and the restarted gang serves the same output again.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import ray
from ray import serve

from cluster.serve.config_file import load_cluster_config
from cluster.serve.pool_options import BOARD_DEPLOYMENT
from core.config import ClusterConfig
from core.sampling import SamplingParams
from engine import LLM
from tests.cluster_fixtures import ServingApp, side_app
from tests.integration.support import MODEL, SERVED_NAME, app_config, engine_section
from tests.waiting import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

EP_APP = "pdserve-ep-test"
ROUTE = "/ep"
PROMPTS = [
    "Experts in parallel: each rank holds half of them.",
    "Hi",
    "The gang steps in lockstep, idle ranks run empty forwards.",
]
MAX_TOKENS = 8
REQUEST_BOUND_S = 60.0  # no in-flight request may take longer than this after a kill


def ep_config(port: int) -> ClusterConfig:
    """The EP app: one prefill replica, one decode gang of two ranks, under its own name."""
    return load_cluster_config(
        app_config(
            port,
            decode={
                "autoscaling": None,
                "num_replicas": 2,
                "expert_parallel": 2,
                "ep_timeout_s": 20.0,
                "num_cpus": 0.25,
            },
            prefill={"num_cpus": 0.25},
            cluster={"address": "auto", "app_name": EP_APP},
        )
    )


@pytest.fixture(scope="module")
def ep_app(serving_app: ServingApp) -> Iterator[tuple[str, ServingApp]]:
    """The EP app next to the shared one (route ``/ep``); removed after."""
    with side_app(serving_app, ep_config(serving_app.config.server.port), ROUTE) as endpoint:
        yield endpoint, serving_app


@pytest.fixture(scope="module")
def reference() -> list[str]:
    """Greedy completions of the offline engine (every expert local), with the app's options."""
    llm = LLM(MODEL, dtype="float32", **engine_section())
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    return [out.text for out in llm.generate(PROMPTS, sampling_params=params)]


def decode_replicas(app: ServingApp) -> list[dict[str, Any]]:
    """RUNNING replicas of the side app's decode pool."""
    return app.running_replicas("Decode", EP_APP)


def greedy_text(endpoint: str, prompt: str) -> str:
    """One greedy completion through the official client."""
    client = openai.OpenAI(base_url=f"{endpoint}/v1", api_key="unused", max_retries=0)
    completion = client.completions.create(
        model=SERVED_NAME,
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
        timeout=60,
    )
    assert completion.usage is not None and completion.usage.completion_tokens == MAX_TOKENS
    return completion.choices[0].text


def test_ep_decode_gang_matches_offline_engine(
    ep_app: tuple[str, ServingApp], reference: list[str]
) -> None:
    endpoint, app = ep_app
    replicas = decode_replicas(app)
    assert len(replicas) == 2
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(lambda p: greedy_text(endpoint, p), PROMPTS * 2))
    assert got == reference * 2
    board = serve.get_deployment_handle(BOARD_DEPLOYMENT, EP_APP)

    def both_ranks_report() -> list[dict[str, Any]]:
        reports: dict[str, list[dict[str, Any]]] = board.snapshot.remote().result(timeout_s=30)
        loads = [r["stats"]["expert_load"] for r in reports.get("decode", [])]
        stats = sorted((s for s in loads if s is not None), key=lambda s: s["rank"])
        done = [s["rank"] for s in stats] == [0, 1]
        return stats if done and all(s["expert_tokens_total"] > 0 for s in stats) else []

    # Both ranks computed expert rows, whichever got the requests.
    stats = wait_until(both_ranks_report, 30, "both decode ranks report expert load")
    assert all(s["steps_total"] > 0 and s["all_to_all_bytes_total"] > 0 for s in stats)


def test_killing_a_rank_restarts_the_gang_and_no_request_hangs(
    ep_app: tuple[str, ServingApp], reference: list[str]
) -> None:
    endpoint, app = ep_app
    before = {r["replica_id"] for r in decode_replicas(app)}
    victim = decode_replicas(app)[1]

    def long_request(i: int) -> int:
        body = {
            "model": SERVED_NAME,
            "prompt": PROMPTS[i % len(PROMPTS)],
            "max_tokens": 400,
            "temperature": 0,
            "ignore_eos": True,
        }
        response = httpx.post(f"{endpoint}/v1/completions", json=body, timeout=REQUEST_BOUND_S)
        return response.status_code

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        in_flight = [pool.submit(long_request, i) for i in range(4)]
        ray.kill(ray.get_actor(victim["actor_name"], namespace="serve"), no_restart=True)
        statuses = [f.result(timeout=REQUEST_BOUND_S + 10) for f in in_flight]
    assert set(statuses) <= {200, 500, 502, 503}, statuses
    wait_until(
        lambda: (
            len(decode_replicas(app)) == 2
            and not {r["replica_id"] for r in decode_replicas(app)} & before
        ),
        150,
        "Serve restarts the whole decode gang (both ranks replaced)",
    )
    got = wait_until(lambda: greedy_text(endpoint, PROMPTS[0]), 60, "restarted gang serves")
    assert got == reference[0]
