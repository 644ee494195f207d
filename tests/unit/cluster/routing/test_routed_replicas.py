"""Which replicas this process's routers hold, and which left them."""

from __future__ import annotations

from cluster.routing import routed_replicas

DECODE = ("app", "Decode")


def test_a_replica_dropped_from_a_routers_set_has_left_until_it_comes_back() -> None:
    routed_replicas.hold(*DECODE, ["a", "b"])
    assert not routed_replicas.has_left(DECODE, "a")
    routed_replicas.hold(*DECODE, ["b"])
    assert routed_replicas.has_left(DECODE, "a") and not routed_replicas.has_left(DECODE, "b")
    assert not routed_replicas.has_left(("app", "Prefill"), "a")  # of its own deployment
    assert not routed_replicas.has_left(None, "a")  # a report of no Serve app
    routed_replicas.hold(*DECODE, ["a", "b"])  # a router's late update: it never left
    assert not routed_replicas.has_left(DECODE, "a")


def test_a_replica_no_router_here_held_has_not_left() -> None:
    routed_replicas.hold(*DECODE, ["b"])  # a new one reports before the routers list it
    assert not routed_replicas.has_left(DECODE, "a")
