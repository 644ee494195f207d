"""CUDA IPC of the KV between two processes on one GPU: a child process owns a KV storage and
shares it (``KVStorage.device_region``); this process maps it and copies blocks device to
device, and the copies hold exactly the child's bytes."""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing.connection import Connection

import pytest
import torch

from core.kv_layout import KVLayout
from engine.kv.cuda_ipc import IpcRegion
from engine.kv.storage import KVStorage
from tests.gpu.helpers import fresh_seed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.timeout(120),
]

LAYOUT = KVLayout(
    "m", "bfloat16", block_size=16, num_layers=4, num_kv_heads=8, head_dim=64, hash_seed=0
)
NUM_BLOCKS = 96


def _blocks(seed: int) -> torch.Tensor:
    """The child's KV bytes, ``[NUM_BLOCKS, block_bytes]`` uint8 (on the CPU)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (NUM_BLOCKS, LAYOUT.block_bytes)
    return torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)


def _exporter(conn: Connection, seed: int) -> None:
    """Own a KV storage holding ``_blocks(seed)``, share it, wait for "done"."""
    store = KVStorage(LAYOUT, NUM_BLOCKS, torch.device("cuda"))
    store.block_bytes_view().copy_(_blocks(seed).cuda())
    store.stage_to_host(list(range(NUM_BLOCKS)))  # as an export does; records the fences
    store.wait_computed(list(range(NUM_BLOCKS)))
    conn.send(store.device_region)
    conn.recv()
    store.close()


def test_a_peer_maps_the_kv_and_copies_exact_blocks_device_to_device() -> None:
    seed = fresh_seed()
    context = mp.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_exporter, args=(child, seed), daemon=True)
    process.start()
    try:
        assert parent.poll(90), "the exporting process sent no region"
        region = parent.recv()
        assert region is not None and IpcRegion.decode(region).num_blocks == NUM_BLOCKS
        store = KVStorage(LAYOUT, 64, torch.device("cuda"))
        peer = store.open_device_peer(region)
        src = [90, 3, 4, 5, 17, 0, 95, 40]
        dst = [1, 2, 3, 60, 61, 62, 7, 8]
        peer.copy_blocks(src, dst)
        peer.fence()
        expected = _blocks(seed)
        got = store.block_bytes_view()[dst].cpu()
        assert torch.equal(got, expected[src]), f"seed {seed}"
        untouched = [b for b in range(64) if b not in dst]
        assert not store.block_bytes_view()[untouched].any()
        assert not store.host.any()  # nothing went through the host mirror
        parent.send("done")
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
    assert process.exitcode == 0


def test_a_mapping_of_another_block_size_is_refused() -> None:
    other = KVLayout("m", "bfloat16", 32, 4, 8, 64, 0)
    store = KVStorage(other, 8, torch.device("cuda"))
    region = IpcRegion(
        gpu_uuid="x", handle="00", storage_bytes=1, storage_offset_bytes=0, tensor_offset_bytes=0,
        ref_counter="00", ref_counter_offset=0, event="", event_sync_required=False,
        num_blocks=8, block_bytes=LAYOUT.block_bytes,
    )  # fmt: skip
    with pytest.raises(ValueError, match="blocks of"):
        store.open_device_peer(region.encode())
