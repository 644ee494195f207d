"""A rolling upgrade's second app: only the new version's pools, each at 0 replicas, their
replicas reporting to the running app's stats board and KV index and their routers following
that index; the running app's own pools are built as before."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from ray.serve import Application

from cluster.routing import board_fingerprints, routed_replicas
from cluster.routing.kv_index.actor import IndexPublisherFactory
from cluster.routing.router_kwargs import RouterSettings
from cluster.serve.app_builder import build_app, build_app_from_config, build_pools_app
from cluster.serve.clients import PoolWatch
from cluster.serve.config_file import config_to_mapping, load_cluster_config
from cluster.serve.rollout_pools import FOLLOW_KEY, ROLLOUT_ROOT_DEPLOYMENT, split_user_config
from cluster.serve.stats_board import BoardReply, BoardReporter, StatsBoard
from core.codec import to_plain
from core.errors import ConfigError
from core.stats import ReplicaReport, ReplicaStats
from replica import ReplicaHooks

pytestmark = pytest.mark.timeout(30)

NEW = {
    "model": {"name": "builtin:tiny-moe"},
    "prefill": {"num_replicas": 2},
    "decode": {"num_replicas": 3},
    "cluster": {"app_name": "pdserve"},
}


def pools_of(app: Application) -> dict[str, Any]:
    root = app._bound_deployment
    (pools,) = root.init_args
    return {
        "root": root,
        **{role: next(iter(pools.values()))[i] for i, role in enumerate(("prefill", "decode"))},
    }


def hooks_of(hooks: Any) -> tuple[BoardReporter, IndexPublisherFactory]:
    """A pool's stats reporter and KV event publisher factory, as the builder made them."""
    assert isinstance(hooks, ReplicaHooks)
    reporter, publisher = hooks.stats_reporter, hooks.kv_events
    assert isinstance(reporter, BoardReporter) and isinstance(publisher, IndexPublisherFactory)
    return reporter, publisher


def router(app: Application) -> RouterSettings:
    config = app._bound_deployment._deployment_config.request_router_config
    return RouterSettings.from_kwargs(config.request_router_kwargs)


def test_the_pools_app_reports_to_the_running_app_and_starts_empty() -> None:
    built = pools_of(build_pools_app({"config": NEW}))
    assert built["root"].name == ROLLOUT_ROOT_DEPLOYMENT
    for role, name in (("prefill", "Prefill"), ("decode", "Decode")):
        deployment = built[role]._bound_deployment
        assert deployment.name == name
        autoscaling = deployment._deployment_config.autoscaling_config
        assert (autoscaling.min_replicas, autoscaling.initial_replicas) == (0, 0)
        reporter, publisher = hooks_of(deployment.init_args[1])
        assert reporter.app_name == "pdserve" and publisher.index_app == "pdserve"
        assert router(built[role]).index_app == "pdserve"


def test_the_running_app_follows_its_own_index() -> None:
    app = build_app_from_config(load_cluster_config(NEW))
    pools = app._bound_deployment.init_args[0]
    prefill, decode = next(iter(pools.values()))
    assert decode._bound_deployment.num_replicas == 3
    reporter, publisher = hooks_of(decode._bound_deployment.init_args[1])
    assert reporter.app_name == "pdserve" and publisher.index_app == ""
    assert router(prefill).index_app == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"config": {**NEW, "decode": {"autoscaling": {"min_replicas": 1, "max_replicas": 2}}}},
         "decode is autoscaled"),
        ({}, "application args need 'config'"),
        ({"config": NEW, "home_app": "pdserve"}, "unknown application args: home_app"),
    ],
)  # fmt: skip
def test_what_a_pools_app_cannot_be_is_refused(args: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_pools_app(args)


def test_the_running_apps_builder_is_unchanged_by_the_new_option() -> None:
    config = load_cluster_config(NEW)
    assert "index_app" not in str(
        build_app({"config": config_to_mapping(config)})._bound_deployment.init_args[0]
    )


def test_the_ingress_user_config_splits_into_fields_and_followed_apps() -> None:
    user_config = {"routing.migration_limit": 2, FOLLOW_KEY: {"tiny-moe": ["pdserve-next"]}}
    assert split_user_config(user_config, "pdserve") == (
        {"routing.migration_limit": 2},
        {"tiny-moe": ["pdserve-next"]},
    )
    assert split_user_config(None, "pdserve") == ({}, {})
    with pytest.raises(ConfigError, match="maps served model names to lists of app names"):
        split_user_config({FOLLOW_KEY: ["pdserve-next"]}, "pdserve")


class BoardMethod:
    def __init__(self, method: Callable[..., Any]) -> None:
        self.method = method

    async def remote(self, *args: Any) -> Any:
        return self.method(*args)


class BoardHandle:
    """The board's Serve handle, as the pool watch calls it."""

    def __init__(self, board: StatsBoard) -> None:
        self.view = BoardMethod(board.view)
        self.hand_off_replica = BoardMethod(board.hand_off_replica)


def report(
    board: StatsBoard, replica_id: str, app: str, fingerprint: str, num_running: int = 0
) -> BoardReply:
    stats = ReplicaStats(kv_fingerprint=fingerprint, num_running=num_running)
    actor = f"SERVE_REPLICA::{app}#Decode#{replica_id}"
    plain = to_plain(ReplicaReport("decode", replica_id, actor, "n", "ip", 1, stats))
    return BoardReply.of(board.report(plain))


def two_apps(
    fingerprints: tuple[str, str] = ("old", "new"), num_running: int = 0
) -> tuple[StatsBoard, PoolWatch]:
    """A board with decode replica ``a`` of ``pdserve`` and ``b`` of ``pdserve-next`` (of
    ``fingerprints``, each running ``num_running`` requests), and a pool watch over it."""
    board = StatsBoard()
    apps = ("pdserve", "pdserve-next")
    for replica_id, app, fingerprint in zip("ab", apps, fingerprints, strict=True):
        report(board, replica_id, app, fingerprint, num_running)
    return board, PoolWatch(BoardHandle(board))  # type: ignore[arg-type]


def test_the_pool_watch_knows_which_app_runs_each_fingerprint() -> None:
    _, watch = two_apps()
    asyncio.run(asyncio.wait_for(watch.snapshot(), timeout=5))
    assert watch.app_of("decode", "new") == "pdserve-next"
    assert watch.app_of("decode", "old") == "pdserve"
    assert watch.app_of("decode", "gone") is None and watch.app_of("prefill", "new") is None
    # each replica's fingerprint is there for this process's routers before Serve polls it
    assert (board_fingerprints.of("a"), board_fingerprints.of("b")) == ("old", "new")


def test_a_fingerprint_both_apps_run_is_spread_over_them() -> None:
    _, watch = two_apps(("same", "same"))  # a change that keeps the KV layout
    asyncio.run(asyncio.wait_for(watch.snapshot(), timeout=5))
    assert {watch.app_of("decode", "same") for _ in range(200)} == {"pdserve", "pdserve-next"}


def test_a_replica_serve_stopped_routing_to_is_not_live_while_it_drains() -> None:
    _, watch = two_apps()
    asyncio.run(asyncio.wait_for(watch.snapshot(), timeout=5))
    assert watch.fingerprints("decode") == {"old": 1, "new": 1}  # no router here yet: the board
    routed_replicas.hold("pdserve", "Decode", ["a"])
    routed_replicas.hold("pdserve", "Decode", [])  # its router saw it leave Serve's set
    assert watch.fingerprints("decode") == {"new": 1} and watch.num_live("decode") == 1
    assert watch.app_of("decode", "old") is None  # at once: no wait for the next board read
    routed_replicas.hold("pdserve", "Decode", ["a"])  # back in the set: live again
    assert watch.app_of("decode", "old") == "pdserve"


def test_a_replica_on_the_board_before_its_router_holds_it_is_not_live_yet() -> None:
    _, watch = two_apps()
    routed_replicas.hold("pdserve-next", "Decode", [])  # the router's long poll lags the report
    asyncio.run(asyncio.wait_for(watch.snapshot(), timeout=5))
    assert watch.fingerprints("decode") == {"old": 1} and watch.app_of("decode", "new") is None
    routed_replicas.hold("pdserve-next", "Decode", ["b"])
    assert watch.app_of("decode", "new") == "pdserve-next"


def test_a_cordoned_pool_takes_no_new_request_but_stays_on_the_board() -> None:
    board, watch = two_apps()
    board.cordon("pdserve", "Decode", True)  # a stepped rollout takes it to 0 next
    asyncio.run(asyncio.wait_for(watch.snapshot(), timeout=5))
    assert watch.fingerprints("decode") == {"new": 1} and watch.app_of("decode", "old") is None
    assert [r["replica_id"] for r in board.snapshot()["decode"]] == ["a", "b"]  # for the drain
    board.cordon("pdserve", "Decode", False)
    asyncio.run(asyncio.wait_for(watch.snapshot(), timeout=5))
    assert watch.app_of("decode", "old") == "pdserve"


def test_only_a_cordoned_pool_is_asked_to_hand_off_and_only_its_replicas_hear_it() -> None:
    board, _ = two_apps(("same", "same"))

    def hears(replica_id: str, app: str) -> bool:
        return report(board, replica_id, app, "same").hand_off

    board.hand_off("pdserve", "Decode")  # not cordoned: its requests would come back to it
    assert not hears("a", "pdserve")
    board.cordon("pdserve", "Decode", True)
    board.hand_off("pdserve", "Decode")
    assert hears("a", "pdserve") and hears("a", "pdserve")  # at every report until uncordoned
    assert not hears("b", "pdserve-next")
    board.cordon("pdserve", "Decode", False)
    assert not hears("a", "pdserve")


def test_a_cordoned_pool_keeps_its_streams_when_only_another_version_could_continue_them() -> None:
    board, _ = two_apps(("old", "new"))
    board.cordon("pdserve", "Decode", True)
    board.hand_off("pdserve", "Decode")
    assert not report(board, "a", "pdserve", "old").hand_off  # "new" would recompute them
    report(board, "c", "pdserve", "old")  # another old replica, but cordoned as well
    assert not report(board, "a", "pdserve", "old").hand_off
    report(board, "b", "pdserve-next", "old")  # the new app runs the same KV (same weights)
    assert report(board, "a", "pdserve", "old").hand_off


@pytest.mark.parametrize(
    ("fingerprints", "num_running", "asked"),
    [
        (("same", "same"), 2, True),  # a live replica can pull its streams' blocks
        (("old", "new"), 2, False),  # only the other version is live: they finish in place
        (("same", "same"), 0, False),  # nothing to hand off
    ],
)
def test_a_decode_replica_that_left_its_routers_is_asked_once_to_hand_its_streams_off(
    fingerprints: tuple[str, str], num_running: int, asked: bool
) -> None:
    board, watch = two_apps(fingerprints, num_running)
    routed_replicas.hold("pdserve", "Decode", ["a"])
    asyncio.run(asyncio.wait_for(watch.refresh(), timeout=5))
    assert watch.leaving.asked_total == 0  # held: serving
    routed_replicas.hold("pdserve", "Decode", [])  # Serve is stopping it
    asyncio.run(asyncio.wait_for(watch.refresh(), timeout=5))
    assert watch.leaving.asked_total == int(asked)
    assert report(board, "a", "pdserve", fingerprints[0], num_running).hand_off is asked
    assert not report(board, "a", "pdserve", fingerprints[0], num_running).hand_off  # once
    assert not report(board, "b", "pdserve-next", fingerprints[1], num_running).hand_off
    asyncio.run(asyncio.wait_for(watch.refresh(), timeout=5))
    assert watch.leaving.asked_total == int(asked)  # not again before ``reask_s``
