"""KV storage in named shared memory (what a same-node importer maps): the KV tensor is the
segment, blocks read back by name, closing unlinks it, and without room it stays private."""

from __future__ import annotations

import os

import pytest
import torch

from core.errors import ConfigError
from core.kv_layout import KVLayout
from core.shared_memory import SHM_DIR, open_segment_readonly
from engine.kv import storage as storage_module
from engine.kv.storage import KVStorage

LAYOUT = KVLayout(
    "m", "float32", block_size=4, num_layers=2, num_kv_heads=2, head_dim=8, hash_seed=0
)


def test_shared_kv_is_readable_by_name_and_unlinked_on_close() -> None:
    storage = KVStorage(LAYOUT, 4, torch.device("cpu"), shared=True)
    name = storage.shared_region
    assert name is not None
    try:
        storage.kv[2].fill_(1.5)  # the KV tensor itself lives in the segment
        peer = open_segment_readonly(name)
        block = peer[2 * LAYOUT.block_bytes : 3 * LAYOUT.block_bytes]
        assert torch.frombuffer(bytearray(block), dtype=torch.float32).eq(1.5).all()
        assert bytes(storage.blocks_view(2, 2)[: LAYOUT.block_bytes]) == bytes(block)
    finally:
        storage.close()
    assert not os.path.exists(os.path.join(SHM_DIR, name))


def test_without_room_in_dev_shm_the_kv_stays_private(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(nbytes: int) -> None:
        raise ConfigError(f"{SHM_DIR} has 0 bytes free, the KV needs {nbytes}")

    monkeypatch.setattr(storage_module, "SharedSegment", refuse)
    storage = KVStorage(LAYOUT, 4, torch.device("cpu"), shared=True)
    assert storage.shared_region is None
    storage.kv[1].fill_(2.0)
    assert bytes(storage.block_view(1)) == bytes(storage.kv[1].numpy().tobytes())
    storage.close()
