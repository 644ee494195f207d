"""Session ids from headers or the ``user`` field; pins with a TTL, bounded, per replica."""

from __future__ import annotations

import pytest

from cluster.routing.sessions import MAX_SESSION_ID_CHARS, SessionAffinity, extract_session_id


def test_header_wins_over_user_and_is_case_insensitive() -> None:
    assert extract_session_id({"X-Session-Id": "s1"}, {"user": "u1"}) == "s1"
    assert extract_session_id({}, {"user": "u1"}) == "u1"
    assert extract_session_id({"x-session-id": ""}, {"user": 5}) is None
    assert extract_session_id({}, {}) is None
    long_id = "x" * (MAX_SESSION_ID_CHARS + 10)
    assert extract_session_id({}, {"user": long_id}) == long_id[:MAX_SESSION_ID_CHARS]


def test_pins_expire_after_the_ttl_from_the_last_request() -> None:
    sessions = SessionAffinity(ttl_s=10.0)
    sessions.record("s", "a", now_s=0.0)
    assert sessions.pin_for("s", 9.0) is not None
    sessions.record("s", "b", now_s=9.0)  # routed again: re-pinned, TTL restarts
    pin = sessions.pin_for("s", 18.0)
    assert pin is not None and pin.replica_id == "b" and pin.expires_at_s == 19.0
    assert sessions.pin_for("s", 19.0) is None
    assert len(sessions) == 0
    assert sessions.pin_for(None, 0.0) is None


def test_bounded_lru_and_forgetting_a_replica() -> None:
    sessions = SessionAffinity(ttl_s=100.0, max_sessions=2)
    sessions.record("s1", "a", 0.0)
    sessions.record("s2", "b", 0.0)
    sessions.record("s1", "a", 1.0)  # s1 is now the most recent
    sessions.record("s3", "a", 2.0)  # evicts s2
    assert sessions.pin_for("s2", 3.0) is None
    assert sessions.forget_replica("a") == 2
    assert len(sessions) == 0


def test_zero_ttl_disables_and_bad_settings_are_rejected() -> None:
    sessions = SessionAffinity(ttl_s=0.0)
    sessions.record("s", "a", 0.0)
    assert len(sessions) == 0
    with pytest.raises(ValueError):
        SessionAffinity(ttl_s=-1.0)
