"""``pdserve down`` on a local ``up``: it signals the recorded owner and returns once that has
exited, even when the owner's parent never reaps it (a zombie); a stale record is not signalled."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.ops import launcher, process_tree, run_state
from cluster.ops.run_state import RunState

pytestmark = pytest.mark.timeout(60)
APP = "down-test"


@pytest.fixture
def owner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[subprocess.Popen[bytes]]:
    """A stand-in for ``up`` (ends on SIGTERM), never reaped before the test has looked."""
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path))
    child = subprocess.Popen(["sleep", "60"])
    yield child
    child.kill()
    child.wait()


def record(pid: int, start_ticks: int | None) -> None:
    run_state.write_state(
        RunState(APP, "http://127.0.0.1:1", "http://127.0.0.1:2", "127.0.0.1:3", pid,
                 owner_start_ticks=start_ticks)
    )  # fmt: skip


def test_down_returns_once_the_owner_is_a_zombie(owner: subprocess.Popen[bytes]) -> None:
    process = process_tree.ref(owner.pid)
    assert process is not None
    record(owner.pid, process.start_ticks)
    # time stands still for down: it can only return by seeing the owner exit, never by
    # reaching its deadline
    message = launcher.down(APP, timeout_s=30, clock=lambda: 0.0)
    assert message.startswith(f"stopped pdserve (pid {owner.pid})")
    state = Path(f"/proc/{owner.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state == "Z"  # exited, and nobody reaped it while down waited
    assert run_state.read_state(APP) is None
    assert owner.wait(timeout=10) == -15


def test_down_does_not_signal_a_process_that_reused_the_pid(
    owner: subprocess.Popen[bytes],
) -> None:
    process = process_tree.ref(owner.pid)
    assert process is not None
    record(owner.pid, process.start_ticks + 1)  # the recorded up started at another time
    message = launcher.down(APP, timeout_s=30)
    assert "was not running" in message
    assert process_tree.is_running(owner.pid)
    assert run_state.read_state(APP) is None
