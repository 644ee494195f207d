"""The lease table on a hand-driven clock: expiry, extension, exactly-once frees, late messages."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from core.errors import TransferError
from core.kv_handle import TransferFailure
from transfer.leases import Lease, LeaseTable, ReleaseCause

pytestmark = pytest.mark.timeout(30)


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def make_table(lease_s: float = 10.0) -> tuple[LeaseTable, FakeClock, list[ReleaseCause]]:
    clock = FakeClock()
    counted: list[ReleaseCause] = []
    table = LeaseTable(lease_s, counted.append, clock=clock, start_reaper=False)
    return table, clock, counted


def add(table: LeaseTable, transfer_id: str) -> list[ReleaseCause]:
    released: list[ReleaseCause] = []
    table.add(Lease(transfer_id, (1, 2), released.append))
    return released


def test_expiry_frees_exactly_once_and_is_counted() -> None:
    table, clock, counted = make_table(lease_s=10.0)
    released = add(table, "a")
    clock.now_s += 9.9
    assert table.reap_expired() == 0
    clock.now_s += 0.2
    assert table.reap_expired() == 1
    assert table.reap_expired() == 0
    assert released == [ReleaseCause.EXPIRED]
    assert counted == [ReleaseCause.EXPIRED]
    assert table.num_live() == 0


def test_heartbeat_extends_the_deadline() -> None:
    table, clock, _ = make_table(lease_s=10.0)
    released = add(table, "a")
    for _ in range(5):
        clock.now_s += 8.0
        assert table.extend("a") == pytest.approx(10.0)
        assert table.reap_expired() == 0
    clock.now_s += 10.5
    assert table.reap_expired() == 1
    assert released == [ReleaseCause.EXPIRED]


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        (lambda t: t.extend("a"), TransferFailure.LEASE_EXPIRED),
        (lambda t: t.begin_pull("a"), TransferFailure.LEASE_EXPIRED),
        (lambda t: t.get("never"), TransferFailure.UNKNOWN_TRANSFER),
    ],
)
def test_late_messages_after_expiry_are_refused_and_change_nothing(
    action: Callable[[LeaseTable], object], reason: TransferFailure
) -> None:
    table, clock, counted = make_table()
    released = add(table, "a")
    clock.now_s += 11.0
    table.reap_expired()
    with pytest.raises(TransferError) as info:
        action(table)
    assert info.value.reason == reason
    assert not table.reclaim("a", ReleaseCause.RELEASED)
    assert released == [ReleaseCause.EXPIRED]
    assert counted == [ReleaseCause.EXPIRED]


def test_completed_pull_frees_and_failed_pull_keeps_the_lease() -> None:
    table, _, _ = make_table()
    released = add(table, "a")
    lease = table.begin_pull("a")
    with pytest.raises(TransferError) as info:
        table.begin_pull("a")
    assert info.value.reason == TransferFailure.ALREADY_PULLING
    table.end_pull(lease, completed=False)
    assert released == [] and table.num_live() == 1
    lease = table.begin_pull("a")  # a retry may pull again
    table.end_pull(lease, completed=True)
    assert released == [ReleaseCause.COMPLETED]
    with pytest.raises(TransferError) as info:
        table.get("a")
    assert info.value.reason == TransferFailure.UNKNOWN_TRANSFER
    assert "completed" in info.value.message


def test_a_raising_on_release_does_not_break_the_table() -> None:
    table, _, counted = make_table()

    def explode(cause: ReleaseCause) -> None:
        raise RuntimeError(cause)

    table.add(Lease("a", (0,), explode))
    assert table.reclaim("a", ReleaseCause.RELEASED)
    assert counted == [ReleaseCause.RELEASED]


def test_close_frees_every_live_lease_and_refuses_new_ones() -> None:
    table, _, _ = make_table()
    first, second = add(table, "a"), add(table, "b")
    table.close()
    assert first == second == [ReleaseCause.SHUTDOWN]
    with pytest.raises(TransferError) as info:
        add(table, "c")
    assert info.value.reason == TransferFailure.EXPORTER_UNAVAILABLE


def test_the_reaper_thread_expires_leases_on_the_real_clock(
    waiter: Callable[..., bool],
) -> None:
    released: list[ReleaseCause] = []
    table = LeaseTable(0.05, lambda cause: None)
    table.add(Lease("a", (0,), released.append))
    assert waiter(lambda: released == [ReleaseCause.EXPIRED], 5.0)
    table.close()
