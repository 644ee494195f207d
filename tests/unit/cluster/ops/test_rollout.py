"""The stepped rollout's driver over a fake fleet: every step keeps both versions within one
replica of the config's P:D ratio, the step reached is saved, pause/resume/rollback walk the
same steps, a drain timeout moves on, and a failed new replica stops the rollout with a typed
error while the old version keeps serving."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from cluster.ops import rollout_state
from cluster.ops.rollout import PoolHealth, RolloutDriver, RolloutTimeouts, Version
from cluster.ops.rollout_state import RolloutPhase, RolloutState
from cluster.ops.upgrade_plan import ratio_deviation
from core.config import Role
from core.errors import RolloutFailedError

pytestmark = pytest.mark.timeout(30)


@dataclass
class FakeFleet:
    """Two versions' pools; a replica set up is healthy after ``start_polls`` health reads,
    a pool set down keeps its stopping replica (and ``stuck_in_flight`` requests) until read
    ``drain_polls`` times; a pool serves one request at a time, none once cordoned (but
    ``stuck_in_flight``). ``log`` lists sizes and cordons in order."""

    num_prefill: int
    num_decode: int
    start_polls: int = 1
    drain_polls: int = 1
    stuck_in_flight: int = 0
    hand_off_moves_streams: bool = True
    failing: set[tuple[Version, Role]] = field(default_factory=set)
    sizes: dict[tuple[Version, Role], int] = field(default_factory=dict)
    replicas: dict[tuple[Version, Role], int] = field(default_factory=dict)
    polls: dict[tuple[Version, Role], int] = field(default_factory=dict)
    calls: list[tuple[Version, Role, int]] = field(default_factory=list)
    deviations: list[float] = field(default_factory=list)
    cordoned: set[tuple[Version, Role]] = field(default_factory=set)
    handed_off: set[tuple[Version, Role]] = field(default_factory=set)
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        counts: tuple[tuple[Role, int], ...] = (
            ("prefill", self.num_prefill),
            ("decode", self.num_decode),
        )
        for role, count in counts:
            self.sizes[(Version.OLD, role)] = self.replicas[(Version.OLD, role)] = count
            self.sizes[(Version.NEW, role)] = self.replicas[(Version.NEW, role)] = 0

    def set_replicas(self, version: Version, role: Role, num_replicas: int) -> None:
        self.calls.append((version, role, num_replicas))
        self.log.append(f"{version.value} {role} {num_replicas}")
        self.sizes[(version, role)] = num_replicas
        self.polls[(version, role)] = 0
        for v in Version:
            self.deviations.append(
                ratio_deviation(
                    self.sizes[(v, "prefill")],
                    self.sizes[(v, "decode")],
                    self.num_prefill,
                    self.num_decode,
                )
            )

    def health(self, version: Version, role: Role) -> PoolHealth:
        key = (version, role)
        self.polls[key] = self.polls.get(key, 0) + 1
        target, live = self.sizes[key], self.replicas[key]
        if target > live and key in self.failing:
            return PoolHealth(target, live, target - live, 0)
        if target > live and self.polls[key] >= self.start_polls:
            self.replicas[key] = live = target
        if target < live and self.polls[key] >= self.drain_polls and not self.stuck_in_flight:
            self.replicas[key] = live = target
        idle = live > target or key in self.cordoned
        in_flight = self.stuck_in_flight if idle else 1
        if key in self.handed_off and self.hand_off_moves_streams:
            in_flight = 0
        return PoolHealth(live, min(live, target), 0, in_flight)

    def hand_off(self, version: Version, role: Role) -> None:
        assert (version, role) in self.cordoned, "only a cordoned pool hands off"
        self.log.append(f"hand off {version.value} {role}")
        self.handed_off.add((version, role))

    def cordon(self, version: Version, role: Role, cordoned: bool) -> None:
        self.log.append(f"{'cordon' if cordoned else 'uncordon'} {version.value} {role}")
        (self.cordoned.add if cordoned else self.cordoned.discard)((version, role))

    def serving(self, version: Version) -> tuple[int, int]:
        return self.sizes[(version, "prefill")], self.sizes[(version, "decode")]


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    return tmp_path


def start(num_prefill: int, num_decode: int) -> RolloutState:
    return RolloutState("app", "m", "app-next", num_prefill, num_decode, 0, RolloutPhase.PAUSED)


def driver(fleet: FakeFleet, clock: FakeClock, **timeouts: float) -> RolloutDriver:
    return RolloutDriver(
        fleet,
        rollout_state.write_rollout,
        rollout_state.take_pause,
        RolloutTimeouts(**{"ready_timeout_s": 10.0, "drain_timeout_s": 5.0, **timeouts}),
        clock=clock,
        sleep=clock.sleep,
    )


@pytest.mark.parametrize(("num_prefill", "num_decode"), [(2, 3), (3, 1), (1, 4), (0, 2), (4, 4)])
def test_a_rollout_replaces_every_replica_within_the_ratio_bound(
    num_prefill: int, num_decode: int
) -> None:
    fleet, clock = FakeFleet(num_prefill, num_decode, start_polls=3, drain_polls=2), FakeClock()
    final = driver(fleet, clock).run(start(num_prefill, num_decode))
    assert final.phase is RolloutPhase.DONE and final.step == final.num_steps
    assert fleet.serving(Version.NEW) == (num_prefill, num_decode)
    assert fleet.serving(Version.OLD) == (0, 0)
    assert max(fleet.deviations) <= 1.0
    # one replica per step: every step is one call up, then one call down
    assert len(fleet.calls) == 2 * (num_prefill + num_decode)
    assert rollout_state.read_rollout("app") == final
    assert final.driver_pid is None


def test_each_step_brings_the_new_replica_up_before_the_old_one_goes() -> None:
    fleet, clock = FakeFleet(1, 2), FakeClock()
    driver(fleet, clock).run(start(1, 2))
    assert fleet.calls == [
        (Version.NEW, "prefill", 1), (Version.OLD, "prefill", 0),
        (Version.NEW, "decode", 1), (Version.OLD, "decode", 1),
        (Version.NEW, "decode", 2), (Version.OLD, "decode", 0),
    ]  # fmt: skip


def test_a_pool_going_to_0_is_cordoned_and_quiet_first_and_uncordoned_coming_back() -> None:
    fleet, clock = FakeFleet(1, 1), FakeClock()
    walk = driver(fleet, clock, quiet_s=3.0, poll_s=1.0)
    done = walk.run(start(1, 1))
    assert fleet.log == [
        "uncordon new prefill", "new prefill 1", "cordon old prefill", "old prefill 0",
        "uncordon new decode", "new decode 1", "cordon old decode", "old decode 0",
    ]  # fmt: skip
    assert clock.now_s >= 2 * 3.0 and walk.num_drain_timeouts == 0  # quiet_s per pool
    fleet.log.clear()
    back = walk.run(replace(done, rolling_back=True))
    assert back.phase is RolloutPhase.ROLLED_BACK
    assert fleet.log == [
        "uncordon old decode", "old decode 1", "cordon new decode", "new decode 0",
        "uncordon old prefill", "old prefill 1", "cordon new prefill", "new prefill 0",
    ]  # fmt: skip


def test_pause_stops_after_the_step_and_resume_finishes() -> None:
    fleet, clock = FakeFleet(2, 2), FakeClock()
    walk = RolloutDriver(
        fleet, pausing_at(2), rollout_state.take_pause, clock=clock, sleep=clock.sleep
    )
    paused = walk.run(start(2, 2))
    assert paused.phase is RolloutPhase.PAUSED and paused.step == 2
    assert rollout_state.read_rollout("app") == paused
    assert fleet.serving(Version.NEW) == (1, 1) and fleet.serving(Version.OLD) == (1, 1)
    assert paused.progress_line() == (
        "step 2/4: Prefill 1 old + 1 new, Decode 1 old + 1 new (paused)"
    )
    resumed = driver(fleet, clock).run(paused)
    assert resumed.phase is RolloutPhase.DONE and fleet.serving(Version.NEW) == (2, 2)


def pausing_at(step: int) -> Callable[[RolloutState], None]:
    """A save that asks for a pause (as ``pdserve upgrade --pause`` would) once ``step`` is
    reached."""

    def save(state: RolloutState) -> None:
        rollout_state.write_rollout(state)
        if state.step == step and state.phase is RolloutPhase.RUNNING:
            rollout_state.request_pause(state.app_name)

    return save


def test_rollback_walks_the_same_steps_backwards() -> None:
    fleet, clock = FakeFleet(2, 3), FakeClock()
    forward = RolloutDriver(
        fleet, pausing_at(3), rollout_state.take_pause, clock=clock, sleep=clock.sleep
    )
    at_three = forward.run(start(2, 3))
    assert at_three.step == 3 and at_three.phase is RolloutPhase.PAUSED
    forward_calls = list(fleet.calls)
    fleet.calls.clear()
    back = driver(fleet, clock).run(replace(at_three, rolling_back=True))
    assert back.phase is RolloutPhase.ROLLED_BACK and back.step == 0
    assert fleet.serving(Version.OLD) == (2, 3) and fleet.serving(Version.NEW) == (0, 0)
    assert max(fleet.deviations) <= 1.0
    # backwards: each forward step undone in reverse order, the old version gaining first
    undo = {Version.NEW: Version.OLD, Version.OLD: Version.NEW}
    steps = list(zip(forward_calls[::2], forward_calls[1::2], strict=True))[::-1]
    assert [(v, r) for v, r, _ in fleet.calls] == [
        (undo[v], r) for up, down in steps for v, r, _ in (up, down)
    ]


def test_a_drain_timeout_moves_on_and_is_counted() -> None:
    fleet = FakeFleet(1, 1, stuck_in_flight=2, hand_off_moves_streams=False)
    clock = FakeClock()
    walk = driver(fleet, clock, drain_timeout_s=5.0, poll_s=1.0)
    final = walk.run(start(1, 1))
    assert final.phase is RolloutPhase.DONE
    # prefill: the cordoned pool never went quiet, then its stopping replica never emptied;
    # decode: the same, and once more after it was asked to hand its streams off
    assert walk.num_drain_timeouts == 5
    assert clock.now_s >= 25.0


def test_a_cordoned_decode_pool_hands_off_the_streams_that_outlast_the_drain() -> None:
    fleet, clock = FakeFleet(1, 1, stuck_in_flight=2), FakeClock()
    walk = driver(fleet, clock, drain_timeout_s=5.0, quiet_s=1.0, poll_s=1.0)
    assert walk.run(start(1, 1)).phase is RolloutPhase.DONE
    decode = fleet.log[fleet.log.index("cordon old decode") :]
    assert decode == ["cordon old decode", "hand off old decode", "old decode 0"]
    assert "hand off old prefill" not in fleet.log  # a prefill's requests fail over
    # prefill's two waits and decode's first ran out; after the handoff decode went quiet
    assert walk.num_drain_timeouts == 3


def test_a_failed_new_replica_stops_the_rollout_with_the_old_version_serving() -> None:
    fleet, clock = FakeFleet(2, 2), FakeClock()
    fleet.failing.add((Version.NEW, "decode"))
    with pytest.raises(RolloutFailedError, match="new decode replica failed") as raised:
        driver(fleet, clock).run(start(2, 2))
    assert raised.value.param == "decode"
    failed = rollout_state.read_rollout("app")
    assert failed is not None and failed.phase is RolloutPhase.FAILED and failed.step == 1
    assert failed.error == raised.value.message
    # the failing replica was taken down; the old version keeps the rest of the fleet
    assert fleet.serving(Version.NEW) == (1, 0) and fleet.serving(Version.OLD) == (1, 2)
    assert max(fleet.deviations) <= 1.0


def test_a_new_replica_never_healthy_stops_at_the_ready_timeout() -> None:
    fleet, clock = FakeFleet(1, 1, start_polls=1000), FakeClock()
    with pytest.raises(RolloutFailedError, match="0/1 healthy replicas after 10 s"):
        driver(fleet, clock).run(start(1, 1))
    assert fleet.serving(Version.OLD) == (1, 1) and fleet.serving(Version.NEW) == (0, 0)


def test_the_state_file_round_trips_and_the_pause_marker_is_taken_once() -> None:
    state = replace(start(3, 5).at(3, RolloutPhase.RUNNING), rolling_back=True, driver_pid=7)
    rollout_state.write_rollout(state)
    assert rollout_state.read_rollout("app") == state
    assert state.progress_line() == (
        "step 3/8: Prefill 2 old + 1 new, Decode 3 old + 2 new (running, rolling back)"
    )
    rollout_state.request_pause("app")
    assert rollout_state.take_pause("app") and not rollout_state.take_pause("app")
    rollout_state.clear_rollout("app")
    assert rollout_state.read_rollout("app") is None
