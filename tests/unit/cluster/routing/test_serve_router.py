"""The Serve request routers, driven without a Ray cluster: Serve's own router base class, the
pending requests and replica descriptions it would pass, and a local index."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
from ray.serve.request_router import PendingRequest, ReplicaID

from cluster.routing import board_fingerprints, live_settings, routed_replicas
from cluster.routing.kv_index.follower import (
    ActorIndexSource,
    StaticIndexSource,
)
from cluster.routing.kv_index.index import KVIndex
from cluster.routing.kv_index.replication import KVIndexServer
from cluster.routing.live_settings import LiveRouting
from cluster.routing.prefix_copy_delivery import PrefixCopyDelivery
from cluster.routing.routing_metrics import RoutingMetrics
from cluster.routing.serve_router import (
    HotPrefixRequestRouter,
    PdserveRequestRouter,
    PrefixAwareRequestRouter,
    RoundRobinRequestRouter,
)
from core.codec import to_plain
from core.config import HotPrefixConfig
from core.kv_handle import KVHandle
from core.kv_index_messages import CompactBatch, IndexOp
from core.messages import (
    PrefillRequest,
    PrefixCopyCall,
    PrefixExport,
    RoutingKeys,
    WarmPrefixRequest,
)
from core.sampling import SamplingParams
from replica.prefix_warming import WarmPrefixResult

DEPLOYMENT = DeploymentID(name="Prefill", app_name="test-app")
BLOCK_SIZE = 4
T = TypeVar("T")


@pytest.fixture(autouse=True)
def event_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """Serve's pending requests create futures, so a current loop must exist (as in Serve)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


def run(awaitable: Awaitable[T]) -> T:
    return asyncio.get_event_loop().run_until_complete(awaitable)


@dataclass
class Replica:
    """What a router reads from Serve's ``RunningReplica``."""

    replica_id: ReplicaID
    routing_stats: dict[str, Any] = field(default_factory=dict)
    max_ongoing_requests: int = 8
    multiplexed_model_ids: set[str] = field(default_factory=set)

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return 0


def replica(name: str, **stats: Any) -> Replica:
    return Replica(ReplicaID(unique_id=name, deployment_id=DEPLOYMENT), dict(stats))


def make_router(
    router_class: type[PdserveRequestRouter], index: KVIndex | None, **kwargs: Any
) -> PdserveRequestRouter:
    router = router_class(deployment_id=DEPLOYMENT, handle_source=DeploymentHandleSource.UNKNOWN)
    router.initialize_state(use_index=False, block_size=BLOCK_SIZE, **{"pool": "prefill", **kwargs})
    router.index_source = StaticIndexSource(index)
    router.metrics = RoutingMetrics()
    return router


_counter = iter(range(10**6))


def pending(hashes: Sequence[int] = (), session: str | None = None) -> PendingRequest:
    number = next(_counter)
    prompt = list(range(len(hashes) * BLOCK_SIZE + 1))
    keys = RoutingKeys(tuple(hashes), len(prompt), session)
    request = PrefillRequest(f"req-{number}", prompt, SamplingParams(), keys)
    metadata = RequestMetadata(request_id=f"req-{number}", internal_request_id=f"int-{number}")
    return PendingRequest(args=[to_plain(request)], kwargs={}, metadata=metadata)


def pending_of(fingerprint: str) -> PendingRequest:
    """A request of two blocks paired with ``fingerprint``'s replicas."""
    request = pending([1, 2])
    request.args[0]["routing"]["kv_fingerprint"] = fingerprint
    return request


def choose(
    router: PdserveRequestRouter, replicas: list[Replica], request: PendingRequest
) -> list[str]:
    ranks = run(router.choose_replicas(replicas, request))  # type: ignore[arg-type]
    assert all(len(rank) == 1 for rank in ranks)
    return [rank[0].replica_id.unique_id for rank in ranks]


def index_with(pool: str, **held: list[int]) -> KVIndex:
    index = KVIndex()
    for replica_id, hashes in held.items():
        index.resync(replica_id, hashes, 0, pool=pool)
    return index


def test_prefix_aware_ranks_the_cache_holder_first_and_records_metrics() -> None:
    router = make_router(PrefixAwareRequestRouter, index_with("prefill", b=[1, 2, 3]))
    replicas = [replica("a"), replica("b")]
    request = pending([1, 2, 3, 4])
    assert choose(router, replicas, request) == ["b", "a"]
    pool = router.metrics.snapshot().pools["prefill"]
    assert pool.decisions_total == {"cache_hit": 1}
    assert pool.prefix_hit_rate == 3 / 4
    assert router.load.num_requests("b") == 1
    assert router.load.num_tokens("b") == BLOCK_SIZE + 1  # only the uncached tail is work
    router.on_request_completed(replicas[1].replica_id, request.metadata.internal_request_id)
    assert router.load.num_requests("b") == 0


def test_in_flight_load_spreads_a_burst_and_follows_the_replica_serve_used() -> None:
    router = make_router(PrefixAwareRequestRouter, index_with("prefill"))
    replicas = [replica("a"), replica("b"), replica("c")]
    firsts = [choose(router, replicas, pending([10 + i, 20]))[0] for i in range(3)]
    assert sorted(firsts) == ["a", "b", "c"]
    request = pending([99])
    first = choose(router, replicas, request)[0]
    other = next(r for r in replicas if r.replica_id.unique_id != first)
    router.on_request_routed(request, other.replica_id, result=None)
    assert router.load.num_requests(other.replica_id.unique_id) == 2


def test_a_retried_choice_counts_one_decision() -> None:
    router = make_router(PrefixAwareRequestRouter, index_with("prefill"))
    request = pending([1])
    choose(router, [replica("a"), replica("b")], request)
    choose(router, [replica("a"), replica("b")], request)
    assert router.metrics.snapshot().pools["prefill"].decision_latency_s.count == 1
    assert len(router.load) == 1


def test_session_affinity_across_turns_and_replica_death() -> None:
    router = make_router(PrefixAwareRequestRouter, index_with("prefill", b=[1, 2]))
    replicas = [replica("a"), replica("b")]
    assert choose(router, replicas, pending([1, 2], session="s"))[0] == "b"
    # the next turn's blocks are not indexed yet: the session pin keeps it on b
    decision_order = choose(router, replicas, pending([7, 8, 9], session="s"))
    assert decision_order[0] == "b"
    assert router.metrics.snapshot().pools["prefill"].decisions_total["session_affinity"] == 1
    router.on_replica_actor_died(replicas[1].replica_id)
    assert router.index_source.gone == ["b"]  # type: ignore[attr-defined]
    assert router.load.num_requests("b") == 0
    assert choose(router, [replicas[0]], pending([1, 2], session="s")) == ["a"]


def test_replicas_leaving_the_serve_set_leave_the_index() -> None:
    router = make_router(PrefixAwareRequestRouter, index_with("prefill", a=[1], b=[1]))
    a, b = replica("a"), replica("b")

    async def update(replicas: list[Replica]) -> None:
        router.update_replicas(replicas)  # type: ignore[arg-type]
        await asyncio.sleep(0)  # let Serve's queue-length probe of new replicas run

    run(update([a, b]))
    assert choose(router, [a, b], pending([1], session="s"))[0] in {"a", "b"}
    run(update([a]))
    assert router.index_source.gone == ["b"]  # type: ignore[attr-defined]
    assert router.index_source.view().replica_ids() == ["a"]  # type: ignore[union-attr]
    assert router.load.num_requests("b") == 0
    deployment = routed_replicas.deployment_of("SERVE_REPLICA::test-app#Prefill#b")
    assert routed_replicas.routable(deployment, "a")
    assert not routed_replicas.routable(deployment, "b")  # the board's readers skip it
    run(update([a, b]))  # back in Serve's set (it was unreachable for a moment): live again
    assert routed_replicas.routable(deployment, "b")


def test_routing_stats_steer_the_decode_pool_to_free_kv() -> None:
    router = make_router(PrefixAwareRequestRouter, index_with("decode", a=[1]), pool="decode")
    crowded = replica("a", kv_blocks_used=90, kv_blocks_free=10, num_waiting=0)
    roomy = replica("b", kv_blocks_used=10, kv_blocks_free=90, num_waiting=0)
    assert choose(router, [crowded, roomy], pending([1, 2]))[0] == "b"


def test_without_an_index_the_reason_is_degraded_index() -> None:
    router = make_router(PrefixAwareRequestRouter, None)
    choose(router, [replica("a"), replica("b")], pending([1, 2]))
    assert router.metrics.snapshot().pools["prefill"].decisions_total == {"degraded_index": 1}


def test_round_robin_router_rotates_and_empty_candidates_wait() -> None:
    router = make_router(RoundRobinRequestRouter, index_with("prefill", a=[1]))
    replicas = [replica("a"), replica("b"), replica("c")]
    firsts = [choose(router, replicas, pending([1]))[0] for _ in range(6)]
    assert sorted(firsts) == ["a", "a", "b", "b", "c", "c"]
    assert run(router.choose_replicas([], pending([1]))) == []


def test_a_failing_decision_falls_back_to_serves_order() -> None:
    router = make_router(PrefixAwareRequestRouter, index_with("prefill"))

    class BrokenPolicy:
        name = "broken"

        def choose(self, inputs: object) -> object:
            raise RuntimeError("bug")

    router.policy = BrokenPolicy()  # type: ignore[assignment]
    assert choose(router, [replica("a"), replica("b")], pending([1])) == ["a", "b"]


def test_policy_from_kwargs_overrides_the_class_default() -> None:
    router = make_router(PrefixAwareRequestRouter, None, policy="round_robin")
    assert router.policy.name == "round_robin"


class FakeIndexActor:
    """An index actor whose method handles answer like Ray's ``.remote`` (awaitables of plain
    data, as the actor's ``core.codec`` boundary answers)."""

    def __init__(self, server: KVIndexServer) -> None:
        self.server = server
        self.updates = self._method(server.updates)
        self.remove_replica = self._method(server.remove_replica)

    @staticmethod
    def _method(fn: Any) -> Any:
        class Handle:
            @staticmethod
            def remote(*args: Any) -> Any:
                future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                future.set_result(to_plain(fn(*args)))
                return future

        return Handle()


@pytest.mark.timeout(20)
def test_actor_index_source_follows_the_server_and_goes_stale() -> None:
    server = KVIndexServer()
    server.resync("b", "prefill", [1, 2], 0)
    now = [0.0]
    source = ActorIndexSource(
        "test-app",
        namespace="pdserve",
        metrics=RoutingMetrics(),
        max_staleness_s=5.0,
        clock=lambda: now[0],
        actor=FakeIndexActor(server),
    )
    assert source.view() is None  # never synced

    async def body() -> None:
        await source.sync_once()
        view = source.view()
        assert view is not None and view.match("prefill", [1, 2]) == {"b": 2}
        server.publish("b", [CompactBatch(0, (IndexOp("removed", [2]),))])
        await source.sync_once()
        assert source.follower.index.match("prefill", [1, 2]) == {"b": 1}
        assert source.best_match("prefill", [1, 2]) == 1
        assert source.best_match("decode", [1, 2]) == 0
        # a decode replica whose block 2 sits in its host tier serves both blocks locally
        server.resync("d", "decode", [1], 0, {"host": [2]})
        await source.sync_once()
        assert source.best_match("decode", [1, 2]) == 2
        source.report_replica_gone("b")

    run(body())
    assert server.index.replica_ids() == ["d"]
    now[0] = 6.0
    assert source.view() is None  # too stale to trust
    assert source.best_match("prefill", [1]) == 0


def test_hot_prefix_router_copies_a_hot_prefix_off_its_swamped_holder() -> None:
    hot_prefixes = {
        "prefill_tokens_per_s": 100.0,
        "ttft_target_s": 0.5,
        "min_copy_rate_per_s": 0.5,  # one request reads as about one per second
        "retire_rate_per_s": 0.0,
    }
    router = make_router(
        HotPrefixRequestRouter, index_with("prefill", b=[1, 2, 3]), hot_prefixes=hot_prefixes
    )
    swamped = replica("b", pending_prompt_tokens=400, kv_block_bytes=2048)  # a 4 s queue
    replicas = [replica("a"), swamped]
    request = pending([1, 2, 3, 4])
    assert choose(router, replicas, request)[0] == "a"  # the queue costs more than the hit
    assert router.hot_prefixes is not None
    (warm,) = router.hot_prefixes.take_warm_requests()
    assert (warm.source_replica_id, warm.target_replica_id) == ("b", "a")
    assert (warm.block_hashes, warm.num_bytes) == ((1, 2, 3), 3 * 2048)
    pool = router.metrics.snapshot().pools["prefill"]
    assert (pool.prefix_copies_made_total, pool.prefix_copy_bytes_total) == (1, 3 * 2048)
    assert pool.hot_prefixes == 1
    assert router.hot_prefixes.heat.reading(1, 0.0).num_queued_tokens > 0
    router.on_request_completed(replicas[0].replica_id, request.metadata.internal_request_id)
    assert router.hot_prefixes.heat.reading(1, 0.0).num_queued_tokens == 0
    router.on_replica_actor_died(replicas[0].replica_id)  # the copy went with its replica
    assert router.hot_prefixes.counters().copies_dropped_total == 1


def test_a_request_is_placed_and_its_prefix_counted_only_on_its_fingerprint() -> None:
    """While two versions serve, the old version's cache holder is no hit for the new."""
    router = make_router(PrefixAwareRequestRouter, index_with("prefill", old=[1, 2, 3]))
    replicas = [
        replica("old", kv_fingerprint="f-old"),
        replica("new1", kv_fingerprint="f-new"),
        replica("new2", kv_fingerprint="f-new"),
    ]

    def paired(fingerprint: str) -> PendingRequest:
        request = pending([1, 2, 3, 4])
        plain = request.args[0]
        plain["routing"]["kv_fingerprint"] = fingerprint
        return request

    assert sorted(choose(router, replicas, paired("f-new"))) == ["new1", "new2"]
    assert choose(router, replicas, paired("f-old")) == ["old"]
    assert choose(router, replicas, paired(""))[0] == "old"  # no fingerprint: any, the hit wins
    gone = choose(router, replicas, paired("f-gone"))  # a stale view: every replica
    assert sorted(gone) == ["new1", "new2", "old"]


def test_a_replica_serve_has_not_polled_yet_takes_its_fingerprint_from_the_board() -> None:
    """A new replica's routing stats reach the routers seconds after it starts; the board's
    report names its fingerprint before, so a P/D request may be placed on it at once."""
    router = make_router(PrefixAwareRequestRouter, index_with("prefill"))
    replicas = [replica("old", kv_fingerprint="f-1"), replica("fresh")]  # fresh: not polled
    assert choose(router, replicas, pending_of("f-1")) == ["old"]
    board_fingerprints.publish({"old": "f-1", "fresh": "f-1"})
    assert sorted(choose(router, replicas, pending_of("f-1"))) == ["fresh", "old"]
    board_fingerprints.publish({"old": "f-1", "fresh": "f-2"})  # another version's
    assert choose(router, replicas, pending_of("f-1")) == ["old"]


def test_a_call_naming_its_replica_goes_there_alone_and_counts_no_load() -> None:
    router = make_router(PrefixAwareRequestRouter, index_with("prefill", b=[1, 2, 3]))
    replicas = [replica("a"), replica("b")]
    call = PrefixCopyCall(
        WarmPrefixRequest("prefill", 1, (1,), "b", "a"), RoutingKeys(replica_id="a")
    )
    metadata = RequestMetadata(request_id="copy", internal_request_id="int-copy")
    request = PendingRequest(args=[to_plain(call)], kwargs={}, metadata=metadata)
    assert choose(router, replicas, request) == ["a"]  # not the holder b, the one named
    gone = PendingRequest(
        args=[to_plain(dataclasses.replace(call, routing=RoutingKeys(replica_id="c")))],
        kwargs={},
        metadata=metadata,
    )
    assert choose(router, replicas, gone) == []  # never another replica
    assert router.load.num_requests("a") == 0
    assert router.metrics.snapshot().pools == {}


class CopyingReplicas:
    """The holder exports every block asked for; the target admits them, unless ``fail``."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    async def export_prefix(self, request: WarmPrefixRequest) -> PrefixExport | None:
        handle = KVHandle("t", "inproc://0", len(request.block_hashes), 2048, "f", 0, "e")
        return PrefixExport(request.block_hashes, handle)

    async def warm_prefix(
        self, request: WarmPrefixRequest, export: PrefixExport
    ) -> WarmPrefixResult:
        if self.fail:
            return WarmPrefixResult(3, failure="pull failed: exporter_unavailable")
        return WarmPrefixResult(3, 3, 3 * 2048)


@pytest.mark.parametrize("fail", [False, True])
def test_a_delivering_router_counts_moved_bytes_and_failed_copies(fail: bool) -> None:
    hot_prefixes = {
        "prefill_tokens_per_s": 100.0,
        "ttft_target_s": 0.5,
        "min_copy_rate_per_s": 0.5,
        "retire_rate_per_s": 0.0,
    }
    router = make_router(
        HotPrefixRequestRouter,
        index_with("prefill", b=[1, 2, 3]),
        hot_prefixes=hot_prefixes,
        deliver_copies=True,
    )
    delivery = PrefixCopyDelivery(CopyingReplicas(fail), router._copy_ended, timeout_s=5.0)
    router.copy_delivery = delivery
    replicas = [replica("a"), replica("b", pending_prompt_tokens=400, kv_block_bytes=2048)]
    assert choose(router, replicas, pending([1, 2, 3, 4]))[0] == "a"
    assert router.hot_prefixes is not None
    assert router.hot_prefixes.take_warm_requests() == []  # taken for delivery
    pool = router.metrics.snapshot().pools["prefill"]
    assert (pool.prefix_copies_made_total, pool.prefix_copy_bytes_total) == (1, 0)  # not yet
    run(asyncio.wait_for(delivery.wait_idle(), timeout=10.0))
    pool = router.metrics.snapshot().pools["prefill"]
    if fail:
        assert (pool.prefix_copy_bytes_total, pool.prefix_copies_dropped_total) == (0, 1)
        assert router.hot_prefixes.replicator.copies_of(1) == frozenset()  # may copy again
        assert pool.hot_prefixes == 0
    else:
        assert (pool.prefix_copy_bytes_total, pool.prefix_copies_dropped_total) == (3 * 2048, 0)
        assert router.hot_prefixes.replicator.copies_of(1) == frozenset({"a"})


@pytest.fixture
def published() -> Iterator[None]:
    """Routing knobs published in this process are withdrawn after the test."""
    yield
    for app in ("test-app", "other-app"):
        live_settings.withdraw(app)


def first(router: PdserveRequestRouter, replicas: list[Replica]) -> str:
    """The first-ranked replica for a prompt ``b`` caches; the request then finishes (no load
    is left to tip the next decision)."""
    request = pending([1, 2, 3, 4])
    chosen = choose(router, replicas, request)[0]
    router.on_request_completed(
        ReplicaID(unique_id=chosen, deployment_id=DEPLOYMENT),
        request.metadata.internal_request_id,
    )
    return chosen


@pytest.mark.usefixtures("published")
def test_routing_knobs_published_for_its_app_take_over_from_the_next_decision() -> None:
    router = make_router(PrefixAwareRequestRouter, index_with("prefill", b=[1, 2, 3]))
    replicas = [replica("a"), replica("b")]
    assert first(router, replicas) == "b"
    live_settings.publish("other-app", LiveRouting("round_robin"))  # another app's routers
    assert first(router, replicas) == "b"

    live_settings.publish("test-app", LiveRouting("round_robin"))
    firsts = [first(router, replicas) for _ in range(2)]
    assert sorted(firsts) == ["a", "b"]  # the cache holder no longer wins every time
    pool = router.metrics.snapshot().pools["prefill"]
    assert pool.policy == "round_robin" and pool.decisions_total["round_robin"] == 2

    live_settings.publish("test-app", LiveRouting("hot_prefix", HotPrefixConfig(head_blocks=2)))
    first(router, replicas)
    assert router.policy.name == "hot_prefix" and router.hot_prefixes is not None
    assert router.hot_prefixes.config.head_blocks == 2

    live_settings.publish("test-app", LiveRouting("prefix_aware"))
    assert first(router, replicas) == "b"
    assert router.hot_prefixes is None and router.settings.policy == "prefix_aware"


@pytest.mark.usefixtures("published")
def test_publishing_the_value_in_place_is_no_new_generation() -> None:
    first = live_settings.publish("test-app", LiveRouting("least_loaded"))
    assert live_settings.publish("test-app", LiveRouting("least_loaded")) == first
    newer = live_settings.publish("test-app", LiveRouting("round_robin"))
    assert newer.generation > first.generation
    assert live_settings.current("test-app") == newer and live_settings.current("x") is None
