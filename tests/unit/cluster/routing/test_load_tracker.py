"""The router's own in-flight accounting: begin, move, finish, retries, expiry."""

from __future__ import annotations

from cluster.routing.load_tracker import LoadTracker


def test_begin_move_finish() -> None:
    load = LoadTracker()
    assert load.begin("q1", "a", 100, now_s=0.0)
    assert load.begin("q2", "a", 50, now_s=0.0)
    assert (load.num_requests("a"), load.num_tokens("a")) == (2, 150)
    load.move("q2", "b")  # Serve used the second rank
    assert (load.num_requests("a"), load.num_tokens("a")) == (1, 100)
    assert (load.num_requests("b"), load.num_tokens("b")) == (1, 50)
    load.finish("q1")
    load.finish("q1")  # idempotent
    load.finish("unknown")
    assert (load.num_requests("a"), load.num_tokens("a")) == (0, 0)
    assert "q2" in load and len(load) == 1


def test_a_retried_decision_replaces_the_first() -> None:
    load = LoadTracker()
    load.begin("q", "a", 10, now_s=0.0)
    assert not load.begin("q", "b", 10, now_s=1.0)
    assert load.num_requests("a") == 0 and load.num_requests("b") == 1


def test_forgotten_and_stale_requests_are_dropped() -> None:
    load = LoadTracker(ttl_s=10.0, max_requests=3)
    load.begin("old", "a", 5, now_s=0.0)
    load.begin("new", "b", 5, now_s=5.0)
    load.begin("newer", "b", 5, now_s=11.0)  # "old" is past the TTL
    assert "old" not in load and load.num_requests("a") == 0
    for i in range(4):
        load.begin(f"q{i}", "c", 1, now_s=12.0)
    assert len(load) == 3  # bounded
    load.forget_replica("c")
    assert load.num_requests("c") == 0
