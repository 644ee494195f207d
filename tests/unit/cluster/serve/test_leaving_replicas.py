"""Asking a decode replica Serve is stopping to hand off: when, how often, and when not."""

from __future__ import annotations

import asyncio

from cluster.routing import routed_replicas
from cluster.serve.leaving_replicas import LeavingDecodes
from core.stats import ReplicaReport, ReplicaStats


def decode(replica_id: str, num_running: int, fingerprint: str = "fp") -> ReplicaReport:
    stats = ReplicaStats(kv_fingerprint=fingerprint, num_running=num_running)
    actor = f"SERVE_REPLICA::app#Decode#{replica_id}"
    return ReplicaReport("decode", replica_id, actor, "n", "ip", 1, stats)


class Asks:
    """The board's ``hand_off_replica``: records each ask; fails while ``down``."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.down = False

    async def __call__(self, replica_id: str) -> None:
        if self.down:
            raise ConnectionError("the board is restarting")
        self.asked.append(replica_id)


def a_left(now: list[float]) -> tuple[Asks, LeavingDecodes]:
    """Replica ``a`` of ``app``'s decode pool left its router (``b`` stays); the asks and a
    ``LeavingDecodes`` on clock ``now[0]`` that re-asks after 2 s."""
    asks = Asks()
    routed_replicas.hold("app", "Decode", ["a", "b"])
    routed_replicas.hold("app", "Decode", ["b"])
    return asks, LeavingDecodes(asks, reask_s=2.0, clock=lambda: now[0])


LIVE = {"decode": {"fp": 1}}


def test_a_leaving_replica_is_asked_again_while_requests_still_run_there() -> None:
    now = [0.0]
    asks, leaving = a_left(now)

    def check(*reports: ReplicaReport) -> None:
        asyncio.run(leaving.check({"decode": list(reports)}, LIVE))

    check(decode("a", 2), decode("b", 1))
    assert asks.asked == ["a"]  # b is still held: it serves
    now[0] = 1.0
    check(decode("a", 1), decode("b", 1))
    assert asks.asked == ["a"]  # asked a moment ago
    now[0] = 2.5
    check(decode("a", 1), decode("b", 1))  # a request that was on its way when it left
    assert asks.asked == ["a", "a"]
    now[0] = 5.0
    check(decode("a", 0), decode("b", 1))
    assert asks.asked == ["a", "a"] and leaving.asked_total == 2  # empty: nothing to ask


def test_an_ask_the_board_missed_is_retried_and_a_replica_gone_is_forgotten() -> None:
    now = [0.0]
    asks, leaving = a_left(now)
    asks.down = True
    asyncio.run(leaving.check({"decode": [decode("a", 1)]}, LIVE))
    assert asks.asked == [] and leaving.asked_total == 0
    asks.down = False
    now[0] = 2.0
    asyncio.run(leaving.check({"decode": [decode("a", 1)]}, LIVE))
    assert asks.asked == ["a"]
    asyncio.run(leaving.check({"decode": [decode("b", 1)]}, LIVE))  # a stopped: off the board
    assert leaving._asked_s == {}


def test_a_leaving_replica_no_live_replica_of_its_fingerprint_could_continue_is_not_asked() -> None:
    asks = Asks()
    leaving = LeavingDecodes(asks)
    routed_replicas.hold("app", "Decode", ["a"])
    routed_replicas.hold("app", "Decode", [])
    reports = {"decode": [decode("a", 3, "old")]}
    asyncio.run(leaving.check(reports, {"decode": {"new": 2}}))
    asyncio.run(leaving.check(reports, {}))  # no live decode at all
    assert asks.asked == []
