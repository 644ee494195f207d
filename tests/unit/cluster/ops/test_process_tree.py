"""``cluster.ops.process_tree``: a zombie counts as stopped, descendants are found, a reused pid is
never taken for the process that had it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.ops import process_tree
from cluster.ops.process_tree import ProcessRef

pytestmark = pytest.mark.timeout(60)


def proc_state(pid: int) -> str | None:
    """The state letter of ``/proc/<pid>/stat`` (None when the pid is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def wait_for_state(pid: int, state: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while proc_state(pid) != state:
        assert time.monotonic() < deadline, f"pid {pid} never reached state {state}"
        os.sched_yield()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A child that runs until killed; reaped afterwards."""
    child = subprocess.Popen(["sleep", "60"])
    yield child
    child.kill()
    child.wait()


def test_an_exited_unreaped_child_is_not_running() -> None:
    child = subprocess.Popen(["true"])
    try:
        wait_for_state(child.pid, "Z")
        os.kill(child.pid, 0)  # the old check: a zombie still "exists"
        assert not process_tree.is_running(child.pid)
        assert process_tree.ref(child.pid) is None
        assert child.pid not in {p.pid for p in process_tree.descendants(os.getpid())}
    finally:
        assert child.wait(timeout=10) == 0
    assert not process_tree.is_running(child.pid)


def test_a_running_child_is_running_and_a_descendant(
    sleeper: subprocess.Popen[bytes],
) -> None:
    assert process_tree.is_running(sleeper.pid)
    process = process_tree.ref(sleeper.pid)
    assert process is not None and process_tree.still_running(process)
    assert process in process_tree.descendants(os.getpid())


def test_grandchildren_are_descendants() -> None:
    script = (
        "import subprocess, sys; c = subprocess.Popen(['sleep', '60']); "
        "print(c.pid, flush=True); sys.exit(-c.wait())"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        grandchild = int(parent.stdout.readline())
        assert grandchild in {p.pid for p in process_tree.descendants(os.getpid())}
        assert grandchild in {p.pid for p in process_tree.descendants(parent.pid)}
        process_tree.kill(process_tree.descendants(parent.pid))
        assert parent.wait(timeout=10) == 9  # its child ended by SIGKILL
    finally:
        parent.kill()
        parent.wait()


def test_wait_stopped_returns_what_still_runs_and_kill_stops_it(
    sleeper: subprocess.Popen[bytes],
) -> None:
    process = process_tree.ref(sleeper.pid)
    assert process is not None
    assert process_tree.wait_stopped([process], timeout_s=0.2) == [process]
    process_tree.kill([process])
    assert process_tree.wait_stopped([process], timeout_s=10) == []  # a zombie until reaped
    assert sleeper.wait(timeout=10) == -9


def test_a_reused_pid_is_not_the_recorded_process(sleeper: subprocess.Popen[bytes]) -> None:
    process = process_tree.ref(sleeper.pid)
    assert process is not None
    other = ProcessRef(process.pid, process.start_ticks - 1)
    assert not process_tree.still_running(other)
    process_tree.kill([other])  # must not touch the process that has the pid now
    assert process_tree.is_running(sleeper.pid)
