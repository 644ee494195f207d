"""Delivering decided hot-prefix copies: holder then target, off the caller's path; every way a
copy ends is an outcome (bytes moved, or why not), and a router counts them."""

from __future__ import annotations

import asyncio

import pytest

from cluster.routing.prefix_copy_delivery import CopyOutcome, PrefixCopyDelivery
from core.kv_handle import KVHandle
from core.messages import PrefixExport, WarmPrefixRequest
from replica.prefix_warming import WarmPrefixResult

pytestmark = pytest.mark.timeout(30)

WARM = WarmPrefixRequest("decode", 1, (1, 2, 3), "holder", "target", num_bytes=3 * 64)
EXPORT = PrefixExport((1, 2), KVHandle("t", "inproc://0", 2, 64, "f", 0, "e"))


class FakeReplicas:
    """The holder exports ``export``; the target admits what it is sent, or ``fails``."""

    def __init__(self, export: PrefixExport | None = EXPORT, fail: Exception | None = None):
        self.export, self.fail = export, fail
        self.calls: list[str] = []
        self.release = asyncio.Event()
        self.hold = False

    async def export_prefix(self, request: WarmPrefixRequest) -> PrefixExport | None:
        self.calls.append(f"export@{request.source_replica_id}")
        if self.hold:
            await self.release.wait()
        return self.export

    async def warm_prefix(
        self, request: WarmPrefixRequest, export: PrefixExport
    ) -> WarmPrefixResult:
        self.calls.append(f"warm@{request.target_replica_id}")
        if self.fail is not None:
            raise self.fail
        num = len(export.block_hashes)
        return WarmPrefixResult(3, num, num * 64, f"{num} of 3 blocks pulled, {num} admitted")


def _deliver(
    replicas: FakeReplicas, *, timeout_s: float = 5.0, count: int = 1, max_in_flight: int = 4
) -> list[CopyOutcome]:
    outcomes: list[CopyOutcome] = []

    async def main() -> None:
        delivery = PrefixCopyDelivery(
            replicas,
            lambda warm, outcome: outcomes.append(outcome),
            timeout_s=timeout_s,
            max_in_flight=max_in_flight,
        )
        for _ in range(count):
            delivery.submit(WARM)
        assert replicas.calls == []  # submit returned before any call ran
        if replicas.hold and count > max_in_flight:
            replicas.release.set()
        await delivery.wait_idle()
        assert delivery.num_in_flight == 0

    asyncio.run(asyncio.wait_for(main(), timeout=20.0))
    return outcomes


def test_a_copy_exports_on_the_holder_then_warms_the_target() -> None:
    replicas = FakeReplicas()
    assert _deliver(replicas) == [CopyOutcome(2, 128, "2 of 3 blocks pulled, 2 admitted")]
    assert replicas.calls == ["export@holder", "warm@target"]


def test_a_holder_without_the_prefix_or_a_broken_call_is_a_failed_copy() -> None:
    (gone,) = _deliver(FakeReplicas(export=None))
    assert gone == CopyOutcome(failure="the holder no longer caches the prefix")
    assert not gone.landed
    (broken,) = _deliver(FakeReplicas(fail=RuntimeError("replica died")))
    assert broken == CopyOutcome(failure="RuntimeError: replica died")


def test_a_copy_with_no_answer_in_time_fails() -> None:
    replicas = FakeReplicas()
    replicas.hold = True  # the holder never answers
    (late,) = _deliver(replicas, timeout_s=0.05)
    assert late == CopyOutcome(failure="no answer within 0.05s")


def test_copies_beyond_the_in_flight_bound_fail_at_once() -> None:
    replicas = FakeReplicas()
    replicas.hold = True
    outcomes = _deliver(replicas, count=3, max_in_flight=2)
    assert outcomes[0] == CopyOutcome(failure="too many copies in flight")
    assert [o.num_bytes for o in outcomes[1:]] == [128, 128]
