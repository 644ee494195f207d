"""Named shared-memory segments for same-node KV: made with their pages allocated, readable by
name from another mapping, refused when ``/dev/shm`` lacks room, unlinked once, and only our own
names are opened."""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys

import pytest

from core.errors import ConfigError
from core.shared_memory import SHM_DIR, SharedSegment, open_segment_readonly


def test_a_segment_is_readable_by_name_until_unlinked() -> None:
    segment = SharedSegment(64 * 1024)
    try:
        segment.buf[:5] = b"kv-ok"
        peer = open_segment_readonly(segment.name)
        assert peer[:5] == b"kv-ok" and len(peer) == 64 * 1024
        with pytest.raises(TypeError):
            peer[0] = 1  # read-only for the peer
        assert os.stat(os.path.join(SHM_DIR, segment.name)).st_blocks * 512 >= 64 * 1024
    finally:
        segment.unlink()
    segment.unlink()  # idempotent
    assert not os.path.exists(os.path.join(SHM_DIR, segment.name))
    assert peer[:5] == b"kv-ok"  # a mapping outlives the name
    with pytest.raises(OSError):
        open_segment_readonly(segment.name)


def test_a_segment_larger_than_dev_shm_is_refused_and_leaves_nothing() -> None:
    stats = os.statvfs(SHM_DIR)
    before = set(os.listdir(SHM_DIR))
    with pytest.raises(ConfigError) as info:
        SharedSegment(stats.f_bavail * stats.f_frsize + (1 << 30))
    assert info.value.param == "transfer.same_node"
    assert set(os.listdir(SHM_DIR)) <= before  # (a dead process's segment may be swept)


@pytest.mark.parametrize("name", ["../etc/passwd", "psm_1234", "pdserve-kv-xyz"])
def test_only_our_segment_names_are_opened(name: str) -> None:
    with pytest.raises(ValueError, match="not a pdserve KV segment"):
        open_segment_readonly(name)


def test_segments_of_dead_creators_in_our_pid_namespace_are_swept() -> None:
    """A creator killed with its resource tracker leaves its segment; the next segment made on
    the node removes it, and never one of a live creator or of another pid namespace."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    namespace = os.stat("/proc/self/ns/pid").st_ino
    names = {
        "orphan": f"pdserve-kv-{namespace}-{dead.pid}-{'a' * 24}",
        "live": f"pdserve-kv-{namespace}-{os.getpid()}-{'b' * 24}",
        "foreign": f"pdserve-kv-{namespace + 1}-{dead.pid}-{'c' * 24}",
        "legacy": f"pdserve-kv-{'d' * 24}",
    }
    for name in names.values():
        with open(os.path.join(SHM_DIR, name), "wb") as f:
            f.write(b"kv")
    try:
        segment = SharedSegment(4096)
        segment.unlink()
        assert segment.name.startswith(f"pdserve-kv-{namespace}-{os.getpid()}-")
        left = set(os.listdir(SHM_DIR))
        assert names["orphan"] not in left
        assert {names["live"], names["foreign"], names["legacy"]} <= left
    finally:
        for name in names.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(SHM_DIR, name))


def test_a_segment_no_one_closed_is_unlinked_when_collected() -> None:
    segment = SharedSegment(4096)
    path = os.path.join(SHM_DIR, segment.name)
    assert os.path.exists(path)
    del segment
    gc.collect()
    assert not os.path.exists(path)


def test_a_process_that_exits_without_closing_its_segment_unlinks_it() -> None:
    """Even when its resource tracker is no help (killed with the process group, say)."""
    script = (
        "from multiprocessing import resource_tracker\n"
        "from core.shared_memory import SharedSegment\n"
        "segment = SharedSegment(4096)\n"
        "resource_tracker.unregister(f'/{segment.name}', 'shared_memory')\n"
        "print(segment.name, flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True
    )
    name = done.stdout.strip()
    assert name.startswith("pdserve-kv-")
    assert not os.path.exists(os.path.join(SHM_DIR, name))
