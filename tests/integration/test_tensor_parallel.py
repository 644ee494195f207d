"""P/D between tensor-parallel pools of different sizes under Serve, in its own app: a prefill
pool of TP=4 gangs hands every prompt to a decode pool of TP=2 gangs.

The app shares the cluster and HTTP proxy with the shared app but lives under ``/tp`` and is
removed at the end. Each replica is one Serve replica owning its gang: rank 0 in the replica's
process, the other ranks child processes of it (so a gang is on its replica's node by
construction). Every prompt prefills remotely (threshold 0) and each decode rank pulls its KV
heads from the prefill ranks holding them; streaming output equals the offline one-rank
engine's; scaling the decode pool up and down adds and removes whole gangs, and removing the
app leaves no follower behind.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from cluster.serve.config_file import load_cluster_config
from cluster.serve.pool_options import DECODE_DEPLOYMENT, PREFILL_DEPLOYMENT
from core.config import ClusterConfig
from core.sampling import SamplingParams
from engine import LLM
from tests.cluster_fixtures import ServingApp, side_app
from tests.integration.support import app_config, engine_section, processes_running
from tests.waiting import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

TP_APP = "pdserve-tp-test"
ROUTE = "/tp"
MODEL = "builtin:tiny-llama"
SERVED = "tiny-llama-tp"
PROMPTS = ["Tensor parallel: each rank holds half the heads.", "Hi"]
MAX_TOKENS = 8
FOLLOWER = "engine.gangs.tp_follower"
PREFILL_TP = 4  # tiny-llama: 8 heads, 2 KV heads (each on two prefill ranks)


@dataclass(frozen=True)
class Follower:
    pid: int
    ppid: int


def tp_config(port: int) -> ClusterConfig:
    """The TP app: one prefill replica of four ranks, one decode replica of two."""
    return load_cluster_config(
        app_config(
            port,
            model={"name": MODEL, "dtype": "float32", "served_name": SERVED},
            prefill={
                "num_replicas": 1,
                "num_cpus": 0.25,
                "engine": {"tensor_parallel_size": PREFILL_TP},
                # NOTE: above Serve's 2 s drain loop, so removal ends in the replica's own
                # shutdown (which unlinks its /dev/shm KV segment) rather than a forced kill
                "graceful_shutdown_timeout_s": 10.0,
            },
            disaggregation={"local_prefill_threshold_tokens": 0},
            decode={
                "autoscaling": None,
                "num_replicas": 1,
                "num_cpus": 0.25,
                "engine": {"tensor_parallel_size": 2},
                "graceful_shutdown_timeout_s": 10.0,
            },
            cluster={"address": "auto", "app_name": TP_APP},
        )
    )


@pytest.fixture(scope="module")
def tp_app(serving_app: ServingApp) -> Iterator[tuple[str, ServingApp]]:
    """The TP app next to the shared one (route ``/tp``); no follower is left once it is gone."""
    with side_app(serving_app, tp_config(serving_app.config.server.port), ROUTE) as endpoint:
        yield endpoint, serving_app
    wait_until(lambda: not followers(), 60, "no follower left once the app is gone")


@pytest.fixture(scope="module")
def reference() -> list[str]:
    """Greedy completions of the offline one-rank engine with the app's options."""
    llm = LLM(MODEL, dtype="float32", **engine_section())
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    return [out.text for out in llm.generate(PROMPTS, sampling_params=params)]


def followers() -> list[Follower]:
    """Every tensor-parallel follower process on this machine (the simulated nodes)."""
    return [Follower(pid, ppid) for pid, ppid in processes_running(FOLLOWER)]


def decode_replicas(app: ServingApp) -> list[dict[str, Any]]:
    """RUNNING replicas of the side app's decode pool."""
    return app.running_replicas(DECODE_DEPLOYMENT, TP_APP)


def decode_followers(app: ServingApp) -> list[Follower]:
    """The followers whose parent is not the prefill replica."""
    [prefill] = app.running_replicas(PREFILL_DEPLOYMENT, TP_APP)
    return [f for f in followers() if f.ppid != prefill["pid"]]


def remote_prefills(endpoint: str) -> float:
    """``pdserve:disagg_decisions_total`` of remote prefills, from the app's ``/metrics``."""
    text = httpx.get(f"{endpoint}/metrics", timeout=30).text
    pattern = r'^pdserve:disagg_decisions_total\{decision="remote",reason="\w+"\} (\S+)$'
    return sum(float(m.group(1)) for m in re.finditer(pattern, text, flags=re.MULTILINE))


def streamed_text(endpoint: str, prompt: str) -> str:
    """One greedy completion, streamed through the official client."""
    client = openai.OpenAI(base_url=f"{endpoint}/v1", api_key="unused", max_retries=0)
    stream = client.completions.create(
        model=SERVED,
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
        stream=True,
        timeout=60,
    )
    return "".join(chunk.choices[0].text for chunk in stream if chunk.choices)


def test_a_tp_decode_gang_streams_what_one_rank_decodes(
    tp_app: tuple[str, ServingApp], reference: list[str]
) -> None:
    endpoint, app = tp_app
    [replica] = decode_replicas(app)
    [prefill] = app.running_replicas(PREFILL_DEPLOYMENT, TP_APP)
    parents = sorted(f.ppid for f in followers())  # ranks are their replica's children
    assert parents == sorted([replica["pid"]] + [prefill["pid"]] * (PREFILL_TP - 1))
    before = remote_prefills(endpoint)
    assert [streamed_text(endpoint, p) for p in PROMPTS] == reference
    assert remote_prefills(endpoint) - before == len(PROMPTS)  # every KV crossed the pools


def test_scaling_a_tp_pool_moves_whole_gangs(
    tp_app: tuple[str, ServingApp], reference: list[str]
) -> None:
    endpoint, app = tp_app
    app.rest.scale(TP_APP, {DECODE_DEPLOYMENT: 2})
    wait_until(lambda: len(decode_replicas(app)) == 2, 120, "two TP decode replicas")
    pids = {r["pid"] for r in decode_replicas(app)}
    wait_until(lambda: {f.ppid for f in decode_followers(app)} == pids, 30, "a follower each")
    assert [streamed_text(endpoint, p) for p in PROMPTS * 2] == reference * 2
    app.rest.scale(TP_APP, {DECODE_DEPLOYMENT: 1})
    wait_until(lambda: len(decode_replicas(app)) == 1, 120, "back to one TP decode replica")
    wait_until(lambda: len(decode_followers(app)) == 1, 60, "the removed gang's follower exits")
    assert streamed_text(endpoint, PROMPTS[0]) == reference[0]
