"""Admission: API keys, the in-flight cap, draining and waiting for idle."""

from __future__ import annotations

import asyncio

import pytest

from cluster.ingress import RequestGate, authenticate
from core.errors import AuthenticationError, OverloadedError, UnavailableError
from tests.unit.cluster.ingress.fakes import run


def test_authenticate() -> None:
    authenticate(None, frozenset())  # no keys configured: open
    authenticate("Bearer b", frozenset({"a", "b"}))
    authenticate("bearer  b ", frozenset({"b"}))
    for header in (None, "", "Bearer", "Bearer c", "Basic b", "b"):
        with pytest.raises(AuthenticationError):
            authenticate(header, frozenset({"a", "b"}))


def test_gate_caps_and_releases_once() -> None:
    gate = RequestGate(max_in_flight_requests=2, retry_after_s=2.5)
    first, second = gate.admit(), gate.admit()
    with pytest.raises(OverloadedError) as over:
        gate.admit()
    assert over.value.retry_after_s == 2.5
    first.release()
    first.release()  # idempotent: must not free a second slot
    assert gate.num_in_flight == 1
    third = gate.admit()
    with pytest.raises(OverloadedError):
        gate.admit()
    second.release()
    third.release()
    assert gate.num_in_flight == 0


def test_draining_refuses_and_wait_idle() -> None:
    gate = RequestGate(max_in_flight_requests=4)

    async def scenario() -> tuple[bool, bool, bool]:
        slot = gate.admit()
        gate.start_draining()
        with pytest.raises(UnavailableError):
            gate.admit()
        timed_out = await gate.wait_idle(0.05)
        waiter = asyncio.create_task(gate.wait_idle(5.0))
        slot.release()
        idle = await waiter
        gate.stop_draining()
        gate.admit().release()
        return timed_out, idle, await gate.wait_idle(0.01)

    assert run(scenario()) == (False, True, True)
