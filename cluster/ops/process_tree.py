"""Processes of this machine by pid, read from Linux ``/proc``: is one still running, which
processes descend from it, and waiting for a set of them to stop.

``down`` waits for the ``up`` process to stop, and ``up`` waits for the Ray processes it started.
Both count a *zombie* (a process that has exited but that its parent has not reaped yet) as
stopped: ``os.kill(pid, 0)`` still succeeds on one, which is why it is not the check here.
Without ``/proc`` (not Linux) a pid counts as running while it exists.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")
_EXITED_STATES = frozenset("ZXx")
"""``/proc/<pid>/stat`` states of a process that has exited: zombie, dead."""


@dataclass(frozen=True)
class ProcessRef:
    """One process: its pid and its start time, so a reused pid is never mistaken for it."""

    pid: int
    start_ticks: int
    """Field 22 of ``/proc/<pid>/stat``: clock ticks after boot when it started."""


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (the state first), or None
    when there is no such process."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (OSError, ValueError):
        return None
    return text.rsplit(")", 1)[1].split()


def is_running(pid: int) -> bool:
    """True while ``pid`` exists and has not exited (a zombie has)."""
    if not _PROC.is_dir():
        return _exists(pid)
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in _EXITED_STATES


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def ref(pid: int) -> ProcessRef | None:
    """``pid`` with its start time, or None when it is not running (without ``/proc``: start
    time 0 while the pid exists)."""
    if not _PROC.is_dir():
        return ProcessRef(pid, 0) if _exists(pid) else None
    fields = _stat_fields(pid)
    if fields is None or fields[0] in _EXITED_STATES:
        return None
    return ProcessRef(pid, int(fields[19]))


def still_running(process: ProcessRef) -> bool:
    """True while the very process ``process`` names runs (not a later one with its pid)."""
    return ref(process.pid) == process


def descendants(root_pid: int) -> list[ProcessRef]:
    """Every running descendant of ``root_pid`` (children, their children, ...); none
    without ``/proc``."""
    if not _PROC.is_dir():
        return []
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[ProcessRef] = []
    todo = [root_pid]
    while todo:
        for child in children.get(todo.pop(), []):
            process = ref(child)
            if process is not None:
                found.append(process)
            todo.append(child)
    return found


def wait_stopped(
    processes: Iterable[ProcessRef],
    timeout_s: float,
    poll_s: float = 0.05,
    clock: Callable[[], float] = time.monotonic,
) -> list[ProcessRef]:
    """Wait until none of ``processes`` runs; returns those still running after ``timeout_s``
    on ``clock``."""
    pending = list(processes)
    deadline = clock() + timeout_s
    while True:
        pending = [process for process in pending if still_running(process)]
        if not pending or clock() >= deadline:
            return pending
        time.sleep(poll_s)


def kill(processes: Iterable[ProcessRef]) -> None:
    """SIGKILL each of ``processes`` that still runs."""
    for process in processes:
        if still_running(process):
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
