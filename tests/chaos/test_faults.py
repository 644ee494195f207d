"""The chaos suite: scripted faults against the live local cluster, each held to the four
invariants of ``harness.py``. ``make test`` runs the short form (faults that need no replica
restart, a few requests each); ``make chaos`` the full form (more traffic, plus replica kills
through ``/admin/faults``, a transfer stall and live scaling)."""

from __future__ import annotations

import asyncio
import functools
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest

from cluster.ops.drills import replica_actor_names, run_drill
from cluster.ops.scaling import Scaled, scale
from cluster.serve.pool_options import BOARD_DEPLOYMENT, DECODE_DEPLOYMENT, PREFILL_DEPLOYMENT
from core.sampling import SamplingParams
from engine import LLM
from tests.chaos.harness import (
    MAX_TOKENS,
    SCALE,
    Outcome,
    Request,
    gather,
    judge,
    metric,
    prompt,
    send,
)
from tests.cluster_fixtures import ServingApp, SimCluster, reset_to_baseline
from tests.integration.support import (
    APP_NAME,
    BATCHED_TOKENS,
    DECODE_RESOURCE,
    KV_BYTES,
    MAX_MODEL_LEN,
    MODEL,
)
from tests.waiting import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]
full_only = pytest.mark.chaos_full
"""Run by ``make chaos`` only (they restart replicas); ``make test`` deselects them."""


@pytest.fixture(scope="module")
def offline() -> Iterator[LLM]:
    yield LLM(MODEL, dtype="float32", max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=KV_BYTES,
              max_num_batched_tokens=BATCHED_TOKENS, max_num_seqs=8)  # fmt: skip


def references(offline: LLM, prompts: list[str], max_tokens: int = MAX_TOKENS) -> dict[str, str]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return {p: out.text for p, out in zip(prompts, offline.generate(prompts, params), strict=True)}


def admin(app: ServingApp, **body: object) -> None:
    response = httpx.post(app.url("/admin/faults"), json=body, timeout=60)
    assert response.status_code == 200, response.text


def calls(app: ServingApp, prompts: list[str], **options: Any) -> list[Request]:
    """One request per prompt, sent with ``options`` (see ``harness.send``)."""
    return [functools.partial(send, app=app, text=p, **options) for p in prompts]


@pytest.fixture(autouse=True)
def _no_faults_left(app: ServingApp) -> Iterator[None]:
    yield
    admin(app, action="transfer_clear")


def disconnected(app: ServingApp) -> float:
    return metric(app, "pdserve:requests_failed_total", reason="client_disconnected")


def cap(app: ServingApp) -> int:
    """The ingress's in-flight limit: scenarios other than overload stay within it."""
    return app.config.server.max_in_flight_requests


def test_client_disconnects_mid_stream(app: ServingApp, offline: LLM) -> None:
    prompts = [prompt("disconnect", i, long=i % 2 == 0) for i in range(3 * SCALE)]
    refs = references(offline, prompts)
    before = disconnected(app)
    outcomes = gather(calls(app, prompts, cancel_after_tokens=2), cap(app))
    cut = sum(o.cancelled for o in outcomes)
    counter = "requests_failed_total{client_disconnected}"
    judge(app, "client disconnect mid-stream", outcomes, refs, counter, cut,
          lambda: disconnected(app) - before)  # fmt: skip


def test_abort_storm(app: ServingApp, offline: LLM) -> None:
    rng = random.Random(7)
    prompts = [prompt("storm", i, long=rng.random() < 0.5) for i in range(12 * SCALE)]
    refs = references(offline, prompts)
    before = disconnected(app)
    cut = [rng.randint(0, MAX_TOKENS + 2) for _ in prompts]  # past the end: not cancelled
    outcomes = gather([
        functools.partial(send, app=app, text=p, cancel_after_tokens=k if k < MAX_TOKENS else None)
        for p, k in zip(prompts, cut, strict=True)
    ], cap(app))  # fmt: skip
    cancelled = sum(o.cancelled for o in outcomes)
    judge(app, "abort storm", outcomes, refs, "requests_failed_total{client_disconnected}",
          cancelled, lambda: disconnected(app) - before)  # fmt: skip


def index_restarts(app: ServingApp) -> float:
    return metric(app, "pdserve:kv_index_restarts_total")


def test_killed_kv_index(app: ServingApp, offline: LLM) -> None:
    """SIGKILL of the KV index actor under load: Ray restarts it empty, routing goes on by load
    and affinity meanwhile, every replica's pump republishes what it caches, and the routers
    reload it; no request fails."""
    prompts = [prompt("kill-index", i, long=True) for i in range(4 * SCALE)]
    refs = references(offline, prompts)
    before = index_restarts(app)
    killed_at: list[float] = []

    async def killer(http: httpx.AsyncClient) -> None:
        await asyncio.to_thread(run_drill, APP_NAME, "kv_index")
        killed_at.append(time.monotonic())

    half = len(prompts) // 2
    outcomes = gather([*calls(app, prompts[:half]), killer, *calls(app, prompts[half:])], cap(app))
    wait_until(
        lambda: index_restarts(app) > before and metric(app, "pdserve:kv_index_num_entries") > 0,
        60,
        "the routers reloaded a refilled index",
        poll_s=0.1,
    )
    print(f"KV index refilled {time.monotonic() - killed_at[0]:.1f} s after the kill")
    judge(app, "KV index actor killed", outcomes, refs, "kv_index_restarts_total >= 1", 1.0,
          lambda: min(1.0, index_restarts(app) - before))  # fmt: skip


def board_restarts(app: ServingApp) -> float:
    return metric(app, "pdserve:stats_board_restarts_total")


def test_killed_stats_board(app: ServingApp, offline: LLM) -> None:
    """SIGKILL of the stats board under load: the ingress keeps its last view of the pools
    meanwhile, Serve replaces the board, replicas post to the new one; no request fails."""
    prompts = [prompt("kill-board", i, long=True) for i in range(4 * SCALE)]
    refs = references(offline, prompts)
    before = board_restarts(app)

    async def killer(http: httpx.AsyncClient) -> None:
        assert len(replica_actor_names(APP_NAME, BOARD_DEPLOYMENT)) == 1
        await asyncio.to_thread(run_drill, APP_NAME, "stats_board")

    half = len(prompts) // 2
    outcomes = gather([*calls(app, prompts[:half]), killer, *calls(app, prompts[half:])], cap(app))
    wait_until(
        lambda: board_restarts(app) > before and app.board()["prefill"] and app.board()["decode"],
        120,
        "the ingress saw the replacement board, refilled by the replicas",
        poll_s=0.2,
    )
    judge(app, "stats board killed", outcomes, refs, "stats_board_restarts_total >= 1", 1.0,
          lambda: min(1.0, board_restarts(app) - before))  # fmt: skip


def controller_restarts(app: ServingApp) -> float:
    return metric(app, "pdserve:serve_controller_restarts_total")


def test_killed_serve_controller(app: ServingApp, sim_cluster: SimCluster, offline: LLM) -> None:
    """SIGKILL of Serve's controller under load: the proxy and the handles keep routing to the
    replicas they know, so no request fails; a ``pdserve scale`` issued right after the kill
    waits for the restarted controller and succeeds; the ingress counts the restart."""
    prompts = [prompt("kill-controller", i, long=True) for i in range(4 * SCALE)]
    refs = references(offline, prompts)
    before = controller_restarts(app)
    scaled: list[Scaled] = []

    async def killer(http: httpx.AsyncClient) -> None:
        await asyncio.to_thread(run_drill, APP_NAME, "serve_controller")
        # the prefill pool's own count: a real scale call, and the app stays as it was
        scaled.append(
            await asyncio.to_thread(
                scale, APP_NAME, 1, None, dashboard_url=sim_cluster.dashboard_url
            )
        )

    half = len(prompts) // 2
    outcomes = gather([*calls(app, prompts[:half]), killer, *calls(app, prompts[half:])], cap(app))
    assert scaled == [Scaled(APP_NAME, {PREFILL_DEPLOYMENT: 1})]
    judge(app, "Serve controller killed", outcomes, refs, "serve_controller_restarts_total >= 1",
          1.0, lambda: min(1.0, controller_restarts(app) - before))  # fmt: skip


def pipelined(app: ServingApp) -> float:
    return metric(app, "pdserve:kv_handoffs_total", mode="pipelined")


def test_clients_leave_during_pipelined_handoffs(app: ServingApp, offline: LLM) -> None:
    # long prompts outgrow one prefill chunk: the decode pulls while the prefill computes, and
    # the client leaves at its first token, while the decode may still be pulling
    prompts = [prompt("pipeline-leave", i, long=True) for i in range(3 * SCALE)]
    refs = references(offline, prompts)
    before = pipelined(app)
    outcomes = gather(calls(app, prompts, cancel_after_tokens=1), cap(app))
    judge(app, "client leaves mid-pipeline", outcomes, refs,
          "kv_handoffs_total{pipelined} = requests", float(len(prompts)),
          lambda: pipelined(app) - before)  # fmt: skip


def _faults_active(app: ServingApp, tag: str) -> bool:
    before = metric(app, "pdserve:transfer_failures_total", role="decode")
    probe = prompt(tag, random.randrange(1 << 30), long=True)
    gather(calls(app, [probe], stream=False))
    return metric(app, "pdserve:transfer_failures_total", role="decode") > before


def test_transfers_fail_and_decode_recomputes(app: ServingApp, offline: LLM) -> None:
    admin(app, action="transfer_fail", duration_s=300)
    wait_until(lambda: _faults_active(app, "probe-fail"), 60, "transfer faults in force")
    prompts = [prompt("transfer-fail", i, long=True) for i in range(4 * SCALE)]
    refs = references(offline, prompts)
    failures = metric(app, "pdserve:transfer_failures_total", role="decode")
    remote = metric(app, "pdserve:disagg_decisions_total", decision="remote")
    handoffs = pipelined(app)
    outcomes = gather(calls(app, prompts, stream=False), cap(app))
    admin(app, action="transfer_clear")
    expected = metric(app, "pdserve:disagg_decisions_total", decision="remote") - remote
    assert expected >= 1, "no request took the remote path"
    # the prompts outgrow a prefill chunk: the failed pulls were pipelined ones, which fail the
    # request on decode (no first token to recompute from) for the ingress to continue it
    assert pipelined(app) - handoffs >= 1
    counter = "transfer_failures_total{decode} = remote requests"
    judge(
        app,
        "KV transfers fail (recompute)",
        outcomes,
        refs,
        counter,
        expected,
        lambda: metric(app, "pdserve:transfer_failures_total", role="decode") - failures,
    )


def test_overload_is_refused_cleanly(app: ServingApp, offline: LLM) -> None:
    limit = app.config.server.max_in_flight_requests
    prompts = [prompt("overload", i, long=False) for i in range(3 * limit * SCALE)]
    refs = references(offline, prompts)
    before = metric(app, "pdserve:requests_rejected_total", reason="overloaded")
    outcomes = gather(calls(app, prompts, stream=False))
    refused = sum(o.status == 429 for o in outcomes)
    assert refused >= 1 and all(o.status in (200, 429) for o in outcomes)
    counter = "requests_rejected_total{overloaded} = 429s"
    judge(
        app,
        "overload (429)",
        outcomes,
        refs,
        counter,
        refused,
        lambda: metric(app, "pdserve:requests_rejected_total", reason="overloaded") - before,
    )


KILL_TOKENS = 96
"""Long enough that streams are still running when the kill lands."""


async def _kill_pool_replica(http: httpx.AsyncClient, app: ServingApp, pool: str) -> None:
    body = {"action": "kill_replica", "pool": pool}
    response = await http.post(app.url("/admin/faults"), json=body)
    assert response.status_code == 200, response.text


def _kill_under_load(
    app: ServingApp,
    prompts: list[str],
    pool: str,
    kill: Callable[[httpx.AsyncClient], Awaitable[None]] | None = None,
) -> list[Outcome]:
    """Stream the first half of ``prompts`` (all of them fit the in-flight cap); once a ``pool``
    replica is busy, kill it through ``/admin/faults`` (or run ``kill``); then send the second
    half (they meet the pool without that replica)."""
    half = len(prompts) // 2
    killed: list[asyncio.Event] = []  # made inside the loop gather() runs

    def event() -> asyncio.Event:
        if not killed:
            killed.append(asyncio.Event())
        return killed[0]

    async def killer(http: httpx.AsyncClient) -> None:
        # /metrics over HTTP, not a Serve handle: a handle made inside this short-lived loop
        # would be left bound to it, and Serve's shutdown waits on it forever
        for _ in range(300):
            running = await asyncio.to_thread(
                metric, app, "pdserve:num_requests_running", role=pool
            )
            if running > 0:
                break
            await asyncio.sleep(0.1)
        await (kill(http) if kill is not None else _kill_pool_replica(http, app, pool))
        event().set()

    async def later(http: httpx.AsyncClient, text: str) -> Outcome:
        await event().wait()
        return await send(http, app=app, text=text, max_tokens=KILL_TOKENS)

    first = calls(app, prompts[:half], max_tokens=KILL_TOKENS)
    second = [functools.partial(later, text=p) for p in prompts[half:]]
    return gather([*first, killer, *second])


@full_only
def test_killed_prefill_replica(app: ServingApp, offline: LLM) -> None:
    prompts = [prompt("kill-prefill", i, long=True) for i in range(cap(app))]
    refs = references(offline, prompts, KILL_TOKENS)

    def replicas() -> set[str]:
        return {d["replica_id"] for d in app.board()["prefill"]}

    before = replicas()
    outcomes = _kill_under_load(app, prompts, "prefill")
    wait_until(lambda: len(replicas() - before) == 1, 180, "Serve replaced the killed replica")
    counter = "prefill replicas replaced"
    judge(app, "prefill replica killed", outcomes, refs, counter, 1.0,
          lambda: float(len(replicas() - before)))  # fmt: skip


@full_only
def test_killed_decode_replica(app: ServingApp, sim_cluster: SimCluster, offline: LLM) -> None:
    scale(APP_NAME, None, 2, dashboard_url=sim_cluster.dashboard_url)
    wait_until(lambda: len([d for d in app.board()["decode"] if d.get("actor_name")]) == 2, 180,
               "two decode replicas")  # fmt: skip
    prompts = [prompt("kill-decode", i, long=True) for i in range(cap(app))]
    refs = references(offline, prompts, KILL_TOKENS)
    before = metric(app, "pdserve:request_migrations_total")
    outcomes = _kill_under_load(app, prompts, "decode")
    judge(app, "decode replica killed (migration)", outcomes, refs,
          "request_migrations_total >= 1", 1.0,
          lambda: min(1.0, metric(app, "pdserve:request_migrations_total") - before))  # fmt: skip


def ingress_started_at(app: ServingApp) -> float:
    return metric(app, "process_start_time_seconds")


@full_only
def test_killed_ingress_replica(app: ServingApp, offline: LLM) -> None:
    """SIGKILL of the ingress replica under load: only the requests inside it fail (their
    connections drop); Serve starts a new ingress, the requests sent after it complete
    token-identical, and the replicas free the dead ingress's requests' KV."""
    prompts = [prompt("kill-ingress", i, long=True) for i in range(cap(app))]
    refs = references(offline, prompts, KILL_TOKENS)
    started_at = ingress_started_at(app)

    async def kill(http: httpx.AsyncClient) -> None:
        await asyncio.to_thread(run_drill, APP_NAME, "ingress")
        await asyncio.to_thread(
            wait_until, lambda: ingress_started_at(app) > started_at, 180, "a new ingress"
        )

    outcomes = _kill_under_load(app, prompts, "decode", kill)
    half = len(prompts) // 2
    inside = [o for o in outcomes[:half] if o.error_type == "connection_lost"]
    assert all(o.error_type is None for o in outcomes[half:]), outcomes[half:]
    counter = "process_start_time_seconds moved (a new ingress)"
    note = f"{len(inside)} of the {half} requests in flight died with the ingress"
    judge(app, "ingress replica killed", [o for o in outcomes if o not in inside], refs, counter,
          1.0, lambda: float(ingress_started_at(app) > started_at), notes=[note])  # fmt: skip


def _add_decode_node(sim_cluster: SimCluster) -> str:
    node = sim_cluster.cluster.add_node(
        num_cpus=2, resources={DECODE_RESOURCE: 4}, object_store_memory=80 * 1024 * 1024
    )
    return str(node.node_id)


def _remove_node(sim_cluster: SimCluster, node_id: str) -> None:
    [node] = [n for n in sim_cluster.cluster.worker_nodes if n.node_id == node_id]
    sim_cluster.cluster.remove_node(node)


@full_only
def test_decode_node_lost(app: ServingApp, sim_cluster: SimCluster, offline: LLM) -> None:
    """A decode node goes away under load (its raylet and every process on it die): the
    requests its replica was serving migrate to the replica on the other decode node, nothing
    else fails, the KV index forgets the lost replica's blocks, and once a node with the decode
    resource returns Serve brings the pool back to its two replicas."""
    added = [_add_decode_node(sim_cluster)]
    scale(APP_NAME, None, 2, dashboard_url=sim_cluster.dashboard_url)

    def decode_nodes() -> list[str]:
        return [r["node_id"] for r in app.running_replicas(DECODE_DEPLOYMENT)]

    wait_until(lambda: len(decode_nodes()) == 2 and metric(app, "pdserve:kv_index_num_replicas")
               == 3, 180, "two decode replicas reporting")  # fmt: skip
    assert len(set(decode_nodes())) == 2, "Serve spreads a pool's replicas over its nodes"
    prompts = [prompt("node-loss", i, long=True) for i in range(cap(app))]
    refs = references(offline, prompts, KILL_TOKENS)
    migrations = metric(app, "pdserve:request_migrations_total")
    lost: list[str] = []

    async def lose_node(http: httpx.AsyncClient) -> None:
        # the node whose replica serves the most requests (the board knows each one's node)
        board = await asyncio.to_thread(app.board)
        busiest = max(board["decode"], key=lambda r: r["stats"]["num_running"])
        lost.append(busiest["node_id"])
        await asyncio.to_thread(_remove_node, sim_cluster, busiest["node_id"])

    outcomes = _kill_under_load(app, prompts, "decode", lose_node)
    wait_until(lambda: metric(app, "pdserve:kv_index_num_replicas") == 2, 60,
               "the index forgot the lost replica")  # fmt: skip
    added.append(_add_decode_node(sim_cluster))
    wait_until(lambda: len(decode_nodes()) == 2 and lost[0] not in decode_nodes(), 180,
               "the pool back to two replicas on the nodes left")  # fmt: skip
    if lost[0] == sim_cluster.decode_node_id:  # the fixture's own node: a new one stands in
        sim_cluster.decode_node_id = next(n for n in decode_nodes() if n in added)
    moved = lambda: min(1.0, metric(app, "pdserve:request_migrations_total") - migrations)  # noqa: E731
    judge(app, "decode node lost (migration)", outcomes, refs, "request_migrations_total >= 1",
          1.0, moved)  # fmt: skip
    reset_to_baseline(app)
    for node_id in added:  # the nodes the baseline's one replica does not use
        if node_id != sim_cluster.decode_node_id and node_id != lost[0]:
            _remove_node(sim_cluster, node_id)


@full_only
def test_transfer_stall(app: ServingApp, offline: LLM) -> None:
    admin(app, action="transfer_stall", duration_s=300, stall_per_chunk_s=0.3)
    prompts = [prompt("transfer-stall", i, long=True) for i in range(4 * SCALE)]
    refs = references(offline, prompts)

    def pulls() -> float:
        return metric(app, "pdserve:transfers_total", role="decode") + metric(
            app, "pdserve:transfer_failures_total", role="decode"
        )

    before, remote = pulls(), metric(app, "pdserve:disagg_decisions_total", decision="remote")
    outcomes = gather(calls(app, prompts), cap(app))
    admin(app, action="transfer_clear")
    expected = metric(app, "pdserve:disagg_decisions_total", decision="remote") - remote
    counter = "transfers + transfer_failures {decode} = remote requests"
    judge(app, "KV transfers stall", outcomes, refs, counter, expected, lambda: pulls() - before)


@full_only
def test_live_scaling_under_load(app: ServingApp, sim_cluster: SimCluster, offline: LLM) -> None:
    prompts = [prompt("scaling", i, long=i % 2 == 0) for i in range(8 * SCALE)]
    refs = references(offline, prompts)
    before = metric(app, "pdserve:replicas")
    scale(APP_NAME, 2, 2, dashboard_url=sim_cluster.dashboard_url)
    outcomes = gather(calls(app, prompts), cap(app))
    wait_until(lambda: metric(app, "pdserve:replicas") == before + 2, 180, "both pools at 2")
    judge(app, "live scaling (1+1 -> 2+2)", outcomes, refs, "pdserve:replicas", before + 2,
          lambda: metric(app, "pdserve:replicas"))  # fmt: skip
