"""Each model's pools under their own names: Serve deployments, board groups, metric labels,
``pdserve scale --model`` and the status rows."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from cluster.ingress.telemetry.worker_stats import WorkerStatsCollector
from cluster.ops.scaling import model_scope
from cluster.ops.status_view import pool_rows
from cluster.serve.clients import PoolWatch
from cluster.serve.pool_options import (
    autoscaling_options,
    pool_deployment_name,
    pool_of_deployment,
)
from cluster.serve.stats_board import StatsBoard
from core.codec import to_plain
from core.config import PoolConfig
from core.errors import ConfigError
from core.stats import ReplicaReport, ReplicaStats
from tests.waiting import async_wait_until


@pytest.mark.parametrize(
    ("role", "scope", "name"),
    [
        ("decode", "", "Decode"),
        ("prefill", "tiny-moe", "Prefill-tiny-moe"),
        ("decode", "org/Model#2", "Decode-org_Model_2"),
    ],
)
def test_deployment_names_round_trip(role: str, scope: str, name: str) -> None:
    assert pool_deployment_name(role, scope) == name
    assert pool_of_deployment(name) == (role, name.partition("-")[2])


def test_other_deployments_are_not_pools() -> None:
    assert pool_of_deployment("Ingress") is None and pool_of_deployment("StatsBoard") is None


def report(replica_id: str, role: str, model: str, used: int = 1) -> dict[str, Any]:
    stats = ReplicaStats(kv_blocks_used=used)
    return to_plain(ReplicaReport(role, replica_id, "", "n", "ip", 1, stats, model=model))


def test_the_board_groups_reports_by_model_pool() -> None:
    single = StatsBoard()
    single.report(report("d1", "decode", ""))
    assert set(single.snapshot()) == {"prefill", "decode"}
    board = StatsBoard()
    for replica_id, role, model in (
        ("a", "decode", "s"),
        ("b", "decode", "l"),
        ("c", "prefill", "l"),
    ):
        board.report(report(replica_id, role, model))
    grouped = board.snapshot()
    assert {k: [r["replica_id"] for r in v] for k, v in grouped.items()} == {
        "decode/s": ["a"],
        "decode/l": ["b"],
        "prefill/l": ["c"],
    }


def test_worker_metrics_carry_the_model_of_each_pool() -> None:
    collector = WorkerStatsCollector("only")
    collector.update(
        {"decode": {"a": ReplicaStats(kv_blocks_used=3)}, "decode/l": {"b": ReplicaStats()}}
    )
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    assert 'pdserve:kv_blocks_used{model_name="only",role="decode"} 3.0' in text
    assert 'pdserve:kv_blocks_used{model_name="l",role="decode"} 0.0' in text


DEPLOYED = {"Decode-small": {}, "Decode-large": {}, "Prefill-large": {}, "Ingress": {}}


def test_scale_picks_the_named_models_pools() -> None:
    assert model_scope("app", DEPLOYED, "large") == "large"
    assert model_scope("app", {"Decode": {}, "Prefill": {}}, None) == ""


@pytest.mark.parametrize(
    ("model", "message"),
    [(None, "serves several models (large, small); pass --model"), ("huge", "no model 'huge'")],
)
def test_scale_without_a_known_model_is_refused(model: str | None, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        model_scope("app", DEPLOYED, model)


def test_status_lists_pools_model_by_model_then_the_ingress() -> None:
    assert pool_rows(DEPLOYED) == [
        ("Prefill-large", "prefill", "large"),
        ("Decode-large", "decode", "large"),
        ("Decode-small", "decode", "small"),
        ("Ingress", "", None),
    ]
    assert pool_rows({})[:2] == [("Prefill", "prefill", None), ("Decode", "decode", None)]


def test_the_look_back_window_and_report_interval_reach_serve_only_when_set() -> None:
    scaling = {"min_replicas": 1, "max_replicas": 3}
    default = autoscaling_options(PoolConfig.model_validate({"autoscaling": scaling}))
    assert default is not None
    assert "look_back_period_s" not in default and "metrics_interval_s" not in default
    short = {**scaling, "look_back_period_s": 5.0, "metrics_interval_s": 1.0}
    options = autoscaling_options(PoolConfig.model_validate({"autoscaling": short}))
    assert options is not None and options["look_back_period_s"] == 5.0
    assert options["metrics_interval_s"] == 1.0


class BoardHandle:
    """A board behind a handle whose calls fail while ``down``."""

    def __init__(self) -> None:
        self.board = StatsBoard()
        self.down = False
        self.view = self

    async def remote(self) -> dict[str, Any]:
        if self.down:
            raise ConnectionError("the board's replica is gone")
        return self.board.view()


def test_the_pool_watch_keeps_its_counts_through_a_board_restart_and_counts_it() -> None:
    handle = BoardHandle()
    handle.board.report(report("p1", "prefill", ""))
    watch = PoolWatch(handle)  # type: ignore[arg-type]

    async def body() -> None:
        await watch.snapshot()
        assert watch.num_live("prefill") == 1
        handle.down = True
        watch.start()
        await async_wait_until(
            lambda: watch.unavailable_total >= 1, 5.0, "the watch saw the board gone"
        )
        assert watch.num_live("prefill") == 1  # the last counts stand while it is away
        handle.board = StatsBoard()  # Serve's replacement: empty until replicas post again
        handle.board.report(report("p1", "prefill", ""))
        handle.down = False
        await async_wait_until(
            lambda: watch.restarts_total == 1, 5.0, "the watch saw the new board"
        )
        watch.stop()

    asyncio.run(body())
    assert watch.num_live("prefill") == 1
