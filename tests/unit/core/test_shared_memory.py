"""Named shared-memory segments for same-node KV: made with their pages allocated, readable by
name from another mapping, refused when ``/dev/shm`` lacks room, unlinked once, and only our own
names are opened."""

from __future__ import annotations

import os

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
    assert set(os.listdir(SHM_DIR)) == before


@pytest.mark.parametrize("name", ["../etc/passwd", "psm_1234", "pdserve-kv-xyz"])
def test_only_our_segment_names_are_opened(name: str) -> None:
    with pytest.raises(ValueError, match="not a pdserve KV segment"):
        open_segment_readonly(name)
