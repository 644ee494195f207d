"""The stepped rollout: replace one model's pools replica by replica, keeping the P:D ratio.

:class:`RolloutDriver` walks :func:`~cluster.ops.upgrade_plan.rolling_steps` one step at a
time. A step moves one replica from one version to the other: the version that gains goes up
first and the driver waits until its new replica runs and reports healthy; then the version
that loses goes down and the driver waits until that pool is drained (the stopping replica is
gone, or nothing is in flight on it), at most ``drain_timeout_s`` (after that the requests
still on it migrate when it stops). A pool that goes to 0 is cordoned first (the ingress puts
no new request on it) and set to 0 only once nothing has been in flight on it for
``quiet_s``: Serve starts a replica for a pool at 0 while it still counts requests there (its
cold start, which no autoscaling policy overrides), so a pool taken to 0 mid-request would
start an old-version replica right after stopping its last one, and Serve would hold the next
request for it. A decode pool whose streams outlast that wait is asked to hand them off
(``StatsBoard.hand_off``): each continues on another replica, which pulls the blocks of its
prompt and tokens so far instead of recomputing them (same KV fingerprint; across two, the
pull is refused and they are recomputed), and the wait runs once more. A pool coming back
from 0 is uncordoned before it grows. Each version's
pools therefore always hold the counts of some step, within one replica of the config's P:D
ratio. Forward the new version gains; a rollback walks the same steps backwards, the old
version gaining.

The step reached is saved after every step (:mod:`~cluster.ops.rollout_state`); a pause
(asked for from another process) stops the walk after the step under way. A new replica that
fails, or is not healthy within ``ready_timeout_s``, is taken down again and the rollout stops
with :class:`~core.errors.RolloutFailedError`, saved as FAILED: the version that was serving
keeps every replica it had at that step.

The fleet is behind :class:`RolloutFleet` (set a version's pool size, read its health), so the
walk is tested without Ray; ``cluster.ops.rollout_fleet`` implements it over Serve.
"""

from __future__ import annotations

import enum
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from cluster.ops.rollout_state import PoolCounts, RolloutPhase, RolloutState
from cluster.serve.pool_scaling import QUIET_S
from core.config import Role
from core.errors import RolloutFailedError

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 600.0
"""How long a new replica may take to start (loading weights, warming up) before the rollout
stops."""
DRAIN_TIMEOUT_S = 120.0
"""How long a pool that lost a replica may take to finish that replica's requests."""
POLL_S = 1.0


class Version(enum.Enum):
    """Which version's pools."""

    OLD = "old"
    NEW = "new"


@dataclass(frozen=True)
class PoolHealth:
    """One version's pool as the fleet sees it now."""

    num_replicas: int
    """Replicas in any state (starting, running, stopping)."""
    num_healthy: int
    """Replicas running and reporting healthy."""
    num_failed: int
    """Replicas that failed to start or were found unhealthy."""
    num_in_flight: int
    """Requests in flight on the pool's replicas."""


class RolloutFleet(Protocol):
    """The pools of both versions of one model."""

    def set_replicas(self, version: Version, role: Role, num_replicas: int) -> None:
        """Set ``version``'s ``role`` pool to ``num_replicas`` in place (returns at once)."""
        ...

    def health(self, version: Version, role: Role) -> PoolHealth:
        """``version``'s ``role`` pool now."""
        ...

    def cordon(self, version: Version, role: Role, cordoned: bool) -> None:
        """Whether the ingress must keep new requests off ``version``'s ``role`` pool."""
        ...

    def hand_off(self, version: Version, role: Role) -> None:
        """Have cordoned ``version``'s ``role`` replicas hand their requests off (decode: each
        stream continues on another replica, which pulls its blocks)."""
        ...


@dataclass(frozen=True)
class RolloutTimeouts:
    """How long the driver waits on the fleet."""

    ready_timeout_s: float = READY_TIMEOUT_S
    drain_timeout_s: float = DRAIN_TIMEOUT_S
    quiet_s: float = QUIET_S
    """How long a cordoned pool must have nothing in flight before it is set to 0."""
    poll_s: float = POLL_S


class QuietFor:
    """A drain's test: True once a pool has had nothing in flight for ``quiet_s`` (called with
    its health and the time, at each poll)."""

    def __init__(self, quiet_s: float) -> None:
        self.quiet_s = quiet_s
        self._since: float | None = None

    def __call__(self, health: PoolHealth, now: float) -> bool:
        if health.num_in_flight:
            self._since = None
            return False
        self._since = now if self._since is None else self._since
        return now - self._since >= self.quiet_s


class RolloutDriver:
    """Walks a rollout's steps over a :class:`RolloutFleet`, saving the step reached."""

    def __init__(
        self,
        fleet: RolloutFleet,
        save: Callable[[RolloutState], object],
        pause_requested: Callable[[str], bool],
        timeouts: RolloutTimeouts | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._fleet = fleet
        self._save = save
        self._pause_requested = pause_requested
        self._timeouts = timeouts or RolloutTimeouts()
        self._clock, self._sleep = clock, sleep
        self.num_drain_timeouts = 0

    def run(self, state: RolloutState) -> RolloutState:
        """Walk from ``state``'s step to the end of its direction (every replica new, or,
        rolling back, every one old); returns the final state (DONE, ROLLED_BACK or PAUSED).
        Raises :class:`RolloutFailedError` after saving the FAILED state."""
        state = replace(state, phase=RolloutPhase.RUNNING, error=None, driver_pid=os.getpid())
        self._save(state)
        end = 0 if state.rolling_back else state.num_steps
        while state.step != end:
            if self._pause_requested(state.app_name):
                state = replace(state, phase=RolloutPhase.PAUSED, driver_pid=None)
                self._save(state)
                logger.info("rollout of %s paused at %s", state.model, state.progress_line())
                return state
            target = state.step + (-1 if state.rolling_back else 1)
            try:
                self._step(state, target)
            except RolloutFailedError as e:
                self._save(
                    replace(state, phase=RolloutPhase.FAILED, error=e.message, driver_pid=None)
                )
                raise
            state = state.at(target, RolloutPhase.RUNNING)
            self._save(state)
            logger.info("rollout of %s: %s", state.model, state.progress_line())
        final = RolloutPhase.ROLLED_BACK if state.rolling_back else RolloutPhase.DONE
        state = replace(state, phase=final, driver_pid=None)
        self._save(state)
        return state

    def _step(self, state: RolloutState, target: int) -> None:
        """Move one replica: the gaining version up (and healthy), then the losing one down
        (and drained)."""
        forward = target > state.step
        counts = {
            Version.NEW: (state.new_replicas(state.step), state.new_replicas(target)),
            Version.OLD: (state.old_replicas(state.step), state.old_replicas(target)),
        }
        gaining, losing = (Version.NEW, Version.OLD) if forward else (Version.OLD, Version.NEW)
        for role in _changed_roles(*counts[gaining]):
            before, after = (_count(c, role) for c in counts[gaining])
            if before == 0:
                self._fleet.cordon(gaining, role, False)
            self._fleet.set_replicas(gaining, role, after)
            self._wait_ready(gaining, role, before, after)
        for role in _changed_roles(*counts[losing]):
            after = _count(counts[losing][1], role)
            if after == 0:
                self._fleet.cordon(losing, role, True)
                self._wait_quiet(losing, role)
            self._fleet.set_replicas(losing, role, after)
            self._wait_drained(losing, role, after)

    def _wait_ready(self, version: Version, role: Role, before: int, after: int) -> None:
        """Until ``after`` replicas are healthy; a failed replica or the ready timeout takes
        the pool back to ``before`` and raises :class:`RolloutFailedError`."""
        deadline = self._clock() + self._timeouts.ready_timeout_s
        while True:
            health = self._fleet.health(version, role)
            if health.num_failed:
                why = f"a {version.value} {role} replica failed to start"
                break
            if health.num_healthy >= after:
                return
            if self._clock() >= deadline:
                why = (
                    f"the {version.value} {role} pool has {health.num_healthy}/{after} healthy "
                    f"replicas after {self._timeouts.ready_timeout_s:g} s"
                )
                break
            self._sleep(self._timeouts.poll_s)
        self._fleet.set_replicas(version, role, before)
        raise RolloutFailedError(
            f"{why}; it was taken down again and the rollout stopped "
            "(pdserve upgrade --resume retries, --rollback returns to the old version)",
            param=role,
        )

    def _wait_quiet(self, version: Version, role: Role) -> None:
        """Until nothing has been in flight on the cordoned pool for ``quiet_s``, or the drain
        timeout; a decode pool's streams still running then are handed off (each continues
        on another replica, pulling its blocks) and the wait runs once more (what is left
        migrates when the pool's replicas stop)."""
        quiet = QuietFor(self._timeouts.quiet_s)
        drained = self._drain(version, role, quiet, "the cordoned %s %s pool still had %d "
                              "requests in flight after %g s")  # fmt: skip
        if drained or role != "decode":
            return  # a prefill's requests are short: what is left fails over when it stops
        self._fleet.hand_off(version, role)
        self._drain(version, role, quiet, "the cordoned %s %s pool still had %d requests in "
                    "flight %g s after it was asked to hand them off; it goes to 0 now and "
                    "they migrate")  # fmt: skip

    def _wait_drained(self, version: Version, role: Role, after: int) -> None:
        """Until the pool is down to ``after`` replicas, or nothing is in flight on it, or the
        drain timeout."""
        self._drain(
            version,
            role,
            lambda health, _: health.num_replicas <= after or health.num_in_flight == 0,
            "the %s %s pool still had %d requests in flight after %g s; they migrate when its "
            "stopping replica goes",
        )

    def _drain(
        self,
        version: Version,
        role: Role,
        done: Callable[[PoolHealth, float], bool],
        timed_out: str,
    ) -> bool:
        """Poll the pool until ``done(health, now)``, at most ``drain_timeout_s`` (then log
        ``timed_out``, count it in :attr:`num_drain_timeouts` and return False)."""
        deadline = self._clock() + self._timeouts.drain_timeout_s
        while True:
            now = self._clock()
            health = self._fleet.health(version, role)
            if done(health, now):
                return True
            if now >= deadline:
                self.num_drain_timeouts += 1
                logger.warning(
                    timed_out, version.value, role, health.num_in_flight,
                    self._timeouts.drain_timeout_s,
                )  # fmt: skip
                return False
            self._sleep(self._timeouts.poll_s)


def _count(counts: PoolCounts, role: Role) -> int:
    return counts.num_prefill if role == "prefill" else counts.num_decode


def _changed_roles(before: PoolCounts, after: PoolCounts) -> list[Role]:
    roles: list[Role] = ["prefill", "decode"]
    return [role for role in roles if _count(before, role) != _count(after, role)]
