"""Where a stepped rollout stands, kept beside the run state ``pdserve up`` records.

``<cache dir>/run/<app>.rollout.json`` holds one :class:`RolloutState`, the app's latest
rollout: the model whose pools are replaced, the apps of its old and new version (the running
app itself, or the pools app an earlier rollout left serving), the config's pool sizes (they
fix :func:`~cluster.ops.upgrade_plan.rolling_steps`), the step reached, the direction and the
phase. The driver rewrites it after every step; ``pdserve upgrade --resume``/``--rollback``
start from it and ``pdserve status`` prints its progress line. ``pdserve upgrade --pause``
leaves a marker file (``<app>.rollout.pause``) the driver takes between steps, so the two
processes never write the same file.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, replace
from pathlib import Path

from cluster.ops.run_state import run_dir, write_json
from cluster.ops.upgrade_plan import RollingStep, rolling_steps
from core.codec import from_plain, to_plain
from core.errors import ConfigError, MessageError


@dataclass(frozen=True)
class PoolCounts:
    """One version's replicas in each pool."""

    num_prefill: int
    num_decode: int


class RolloutPhase(enum.Enum):
    """What the driver of a rollout is doing, or why it stopped."""

    RUNNING = "running"
    PAUSED = "paused"
    FAILED = "failed"
    DONE = "done"
    """Every replica runs the new version."""
    ROLLED_BACK = "rolled_back"
    """Every replica runs the old version again."""


@dataclass(frozen=True)
class RolloutState:
    """One app's stepped rollout of one served model's pools."""

    app_name: str
    model: str
    """The served model's scope (``pool_deployment_name`` reads it)."""
    new_app: str
    """The Serve app the new version's pools run in."""
    num_prefill: int
    """The config's prefill replicas (both versions' sum outside a step)."""
    num_decode: int
    step: int
    """Steps reached: the new version runs ``rolling_steps(...)[step - 1]`` (0: none)."""
    phase: RolloutPhase
    rolling_back: bool = False
    driver_pid: int | None = None
    """The process driving it while ``phase`` is RUNNING."""
    error: str | None = None
    """Why a FAILED rollout stopped."""
    old_app: str = ""
    """The Serve app the old version's pools run in: the running app (the default, as state
    files written before later rollouts existed say) or the previous rollout's app."""
    generation: int = 1
    """How many stepped rollouts of the app this one makes (it names :attr:`new_app`)."""

    def __post_init__(self) -> None:
        if not self.old_app:
            object.__setattr__(self, "old_app", self.app_name)

    @property
    def serving_app(self) -> str:
        """The app whose pools (and config) the model runs as a whole: the new one once DONE,
        else the old one (mid-way both serve; ROLLED_BACK, the old one alone)."""
        return self.new_app if self.phase is RolloutPhase.DONE else self.old_app

    @property
    def steps(self) -> list[RollingStep]:
        """The rollout's steps (:func:`~cluster.ops.upgrade_plan.rolling_steps`)."""
        return rolling_steps(self.num_prefill, self.num_decode)

    @property
    def num_steps(self) -> int:
        """How many steps replace every replica."""
        return len(self.steps)

    def new_replicas(self, step: int) -> PoolCounts:
        """The new version's replicas once ``step`` steps are done."""
        new = self.steps[step - 1] if step > 0 else RollingStep(0, 0)
        return PoolCounts(new.num_new_prefill, new.num_new_decode)

    def old_replicas(self, step: int) -> PoolCounts:
        """The old version's replicas once ``step`` steps are done."""
        new = self.new_replicas(step)
        return PoolCounts(self.num_prefill - new.num_prefill, self.num_decode - new.num_decode)

    def progress_line(self) -> str:
        """``step 3/8: Prefill 2 old + 1 new, Decode 3 old + 2 new (running)``; the apps are
        named (``, pdserve-rollout -> pdserve-rollout-2``) when the old version is not the
        running app's own pools."""
        new, old = self.new_replicas(self.step), self.old_replicas(self.step)
        direction = ", rolling back" if self.rolling_back else ""
        line = (
            f"step {self.step}/{self.num_steps}: "
            f"Prefill {old.num_prefill} old + {new.num_prefill} new, "
            f"Decode {old.num_decode} old + {new.num_decode} new "
            f"({self.phase.value}{direction})"
        )
        if self.old_app != self.app_name:
            line = f"{line}, {self.old_app} -> {self.new_app}"
        return line if self.error is None else f"{line}: {self.error}"

    def at(self, step: int, phase: RolloutPhase, error: str | None = None) -> RolloutState:
        """This state at ``step`` in ``phase``."""
        return replace(self, step=step, phase=phase, error=error)


def rollout_path(app_name: str) -> Path:
    """The rollout state file of ``app_name``."""
    return run_dir() / f"{app_name}.rollout.json"


def pause_path(app_name: str) -> Path:
    """The marker ``pdserve upgrade --pause`` leaves for the driver of ``app_name``."""
    return run_dir() / f"{app_name}.rollout.pause"


def write_rollout(state: RolloutState) -> Path:
    """Write ``state`` atomically (readers never see half a file)."""
    return write_json(rollout_path(state.app_name), to_plain(state))


def read_rollout(app_name: str) -> RolloutState | None:
    """The rollout of ``app_name``, or None when none was started."""
    path = rollout_path(app_name)
    try:
        return from_plain(RolloutState, json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, MessageError) as e:
        raise ConfigError(f"unreadable rollout state {path}: {e}", param="app") from e


def clear_rollout(app_name: str) -> None:
    """Forget the rollout of ``app_name`` (and a pause asked for it)."""
    rollout_path(app_name).unlink(missing_ok=True)
    pause_path(app_name).unlink(missing_ok=True)


def request_pause(app_name: str) -> None:
    """Ask the driver to stop after the step it is in."""
    path = pause_path(app_name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def take_pause(app_name: str) -> bool:
    """Whether a pause was asked for (the request is consumed)."""
    try:
        pause_path(app_name).unlink()
    except FileNotFoundError:
        return False
    return True
