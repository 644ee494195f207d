"""The CUDA IPC region descriptor: a JSON round trip, refusals of anything else, and no region
for KV that is not on a GPU (the mapping itself is tested in tests/gpu/test_cuda_ipc_gpu.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from core.kv_layout import KVLayout
from engine.kv.cuda_ipc import IpcRegion, share_kv
from engine.kv.storage import KVStorage

REGION = IpcRegion(
    gpu_uuid="GPU-1234", handle="ab" * 32, storage_bytes=1 << 30, storage_offset_bytes=4096,
    tensor_offset_bytes=0, ref_counter="2f746f72636800", ref_counter_offset=3, event="cd" * 32,
    event_sync_required=True, num_blocks=100, block_bytes=32768,
)  # fmt: skip


def test_a_region_survives_its_text_form() -> None:
    text = REGION.encode()
    assert isinstance(text, str) and IpcRegion.decode(text) == REGION


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{}",
        '{"handle": "ab"}',
        "/psm_1234",  # a shared-memory name is not a device region
        dataclasses.replace(REGION, version=2).encode(),
    ],
)
def test_anything_else_is_refused_as_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        IpcRegion.decode(text)


def test_kv_off_the_gpu_has_no_device_region() -> None:
    assert share_kv(torch.zeros(4, 16, dtype=torch.uint8)) is None
    layout = KVLayout("m", "float32", 16, 2, 2, 32, 0)
    store = KVStorage(layout, 4, torch.device("cpu"))
    assert store.device_region is None
    with pytest.raises(ValueError, match="CUDA"):
        store.open_device_peer(REGION.encode())
