"""Pulls between tensor-parallel gangs of different sizes: each destination rank gets exactly its
KV heads from source ranks holding them, the bytes moved are the destination's share, and a
failed piece leaves no export pinned and names its blocks."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace

import numpy as np
import pytest

from core.config import TransferConfig
from core.errors import TransferError
from core.kv_handle import TransferFailure, TransferState
from core.kv_layout import KVLayout
from core.tensor_parallel import kv_head_range, plan_kv_pieces
from tests.waiting import wait_until
from transfer import (
    FaultInjection,
    GrpcKVTransport,
    InProcKVHub,
    InProcKVTransport,
    ReleaseCause,
)
from transfer.block_store import NumpyBlockStore
from transfer.shards import KVShard, head_slices

pytestmark = pytest.mark.timeout(60)

NUM_BLOCKS = 24
# 2 layers x 2 x 4 tokens x 4 KV heads x 8 dims, float16
MODEL = KVLayout("shard-model", "float16", 4, 2, 4, 8, 0)


def gang_layouts(size: int, heads: int = 4) -> list[KVLayout]:
    """Each rank's layout of a model with ``heads`` KV heads split over ``size`` ranks."""
    model = replace(MODEL, num_kv_heads=heads)
    if size == 1:
        return [model]
    share = kv_head_range(0, size, heads)[1]
    return [
        replace(model, num_kv_heads=share, tp_size=size, tp_rank=r, total_kv_heads=heads)
        for r in range(size)
    ]


def full_blocks(heads: int, seed: int) -> np.ndarray:
    """Random KV of every head: uint8[NUM_BLOCKS, L, 2, bs, heads, row bytes]."""
    layout = replace(MODEL, num_kv_heads=heads)
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(NUM_BLOCKS, layout.block_bytes), dtype=np.uint8)
    return head_slices(data.reshape(-1).data, layout, NUM_BLOCKS)


def gang_stores(size: int, heads: int, full: np.ndarray | None) -> list[NumpyBlockStore]:
    """One store per rank, each holding its heads of ``full`` (zeros when None)."""
    stores = []
    for rank, layout in enumerate(gang_layouts(size, heads)):
        store = NumpyBlockStore(layout, NUM_BLOCKS)
        if full is not None:
            first, count = kv_head_range(rank, size, heads)
            view = head_slices(store.data.reshape(-1).data, layout, NUM_BLOCKS)
            view[...] = full[:, :, :, :, first : first + count]
        stores.append(store)
    return stores


def gathered(stores: list[NumpyBlockStore], heads: int, block_ids: list[int]) -> np.ndarray:
    """Every head of ``block_ids`` as the gang ``stores`` holds them."""
    size = len(stores)
    out = np.zeros((len(block_ids), *full_blocks(heads, 0).shape[1:]), dtype=np.uint8)
    for rank, store in enumerate(stores):
        first, count = kv_head_range(rank, size, heads)
        view = head_slices(store.data.reshape(-1).data, store.layout, NUM_BLOCKS)
        out[:, :, :, :, first : first + count] = view[block_ids]
    return out


def share_bytes(heads: int) -> int:
    """Bytes of one block with every one of ``heads`` KV heads."""
    return replace(MODEL, num_kv_heads=heads).block_bytes


@pytest.fixture
def hub() -> Iterator[InProcKVHub]:
    yield InProcKVHub()


Pair = tuple[InProcKVTransport, InProcKVTransport, list[NumpyBlockStore], np.ndarray]


@pytest.fixture
def make_pair(hub: InProcKVHub) -> Iterator[Callable[..., Pair]]:
    transports: list[InProcKVTransport] = []

    def make(src: int, dst: int, heads: int = 4, faults: FaultInjection | None = None) -> Pair:
        full = full_blocks(heads, seed=src * 10 + dst)
        source = gang_stores(src, heads, full)
        dest = gang_stores(dst, heads, None)
        prefill = InProcKVTransport(
            source[0], hub, chunk_bytes=4096, rank_stores=source, faults=faults
        )
        decode = InProcKVTransport(dest[0], hub, chunk_bytes=4096, rank_stores=dest)
        transports.extend((prefill, decode))
        return prefill, decode, dest, full

    yield make
    for transport in transports:
        transport.close()


@pytest.mark.parametrize(
    ("src", "dst", "heads"),
    [(2, 1, 4), (1, 2, 4), (4, 2, 4), (2, 4, 4), (4, 2, 2), (1, 4, 2), (4, 1, 2), (1, 1, 4)],
)
def test_every_destination_rank_gets_exactly_its_heads(
    make_pair: Callable[..., Pair], src: int, dst: int, heads: int
) -> None:
    prefill, decode, dest, full = make_pair(src, dst, heads)
    handle = prefill.export(list(range(3, 13)))
    assert handle.tp_size == src
    task = decode.pull(handle, list(range(10, 20)))
    task.result(timeout_s=20)
    np.testing.assert_array_equal(gathered(dest, heads, list(range(10, 20))), full[3:13])
    untouched = gathered(dest, heads, list(range(0, 10)))
    assert not untouched.any()  # nothing written outside the destination blocks
    # every head crosses once: a head the destination gang replicates is placed on each rank
    assert task.status().bytes_total == task.status().bytes_done == 10 * share_bytes(heads)
    assert wait_until(lambda: prefill.exporter.num_live_exports() == 0, 5)  # released


def test_bytes_between_gangs_equal_a_one_rank_pull(make_pair: Callable[..., Pair]) -> None:
    """TP=2 -> TP=1 moves what TP=1 -> TP=1 moves (the benchmark's ratio, exactly)."""
    one = make_pair(1, 1)
    two = make_pair(2, 1)
    moved = []
    for prefill, decode, _, _ in (one, two):
        task = decode.pull(prefill.export(list(range(8))), list(range(8)))
        task.result(timeout_s=20)
        moved.append(task.status().bytes_done)
    assert moved[0] == moved[1] == 8 * MODEL.block_bytes


def test_a_pieces_plan_covers_every_destination_head_once() -> None:
    for src, dst, heads in [(2, 1, 8), (8, 2, 8), (4, 8, 4), (8, 4, 2), (3, 1, 6)]:
        covered = {d: [0] * kv_head_range(d, dst, heads)[1] for d in range(dst)}
        for piece in plan_kv_pieces(src, dst, heads):
            src_first, src_count = kv_head_range(piece.src_rank, src, heads)
            dst_first = kv_head_range(piece.dst_rank, dst, heads)[0]
            assert piece.src_head + piece.num_heads <= src_count
            assert src_first + piece.src_head == dst_first + piece.dst_head  # the same heads
            for h in range(piece.dst_head, piece.dst_head + piece.num_heads):
                covered[piece.dst_rank][h] += 1
        assert all(count == 1 for counts in covered.values() for count in counts)
    with pytest.raises(ValueError, match="cannot split 4 KV heads"):
        plan_kv_pieces(3, 1, 4)


def test_a_gang_refuses_a_whole_block_pull(make_pair: Callable[..., Pair]) -> None:
    prefill, _, _, _ = make_pair(2, 1)
    handle = prefill.export([0, 1])
    with pytest.raises(TransferError, match="pull them by shard") as caught:
        prefill.exporter.pull(
            handle.transfer_id, [], handle.layout_fingerprint, "", threading.Event(), _join
        )
    assert caught.value.reason == TransferFailure.INVALID_REQUEST
    with pytest.raises(TransferError, match="outside this exporter") as caught:
        prefill.exporter.pull(
            handle.transfer_id,
            [],
            handle.layout_fingerprint,
            "",
            threading.Event(),
            _join,
            keep_export=True,
            shard=KVShard(0, 1, 2),
        )
    assert caught.value.reason == TransferFailure.INVALID_REQUEST


def test_a_failed_piece_fails_the_pull_and_frees_the_export(
    make_pair: Callable[..., Pair],
) -> None:
    prefill, decode, _, _ = make_pair(2, 1, faults=FaultInjection(fail_after_chunks=1))
    released: list[ReleaseCause] = []
    handle = prefill.export(list(range(12)), released.append)
    task = decode.pull(handle, list(range(12)))
    status = task.wait(timeout_s=20)
    assert status.state is TransferState.FAILED
    assert status.reason == TransferFailure.EXPORTER_ERROR
    assert set(status.invalid_block_ids) == set(range(12))
    assert wait_until(lambda: prefill.exporter.num_live_exports() == 0, 5)
    assert len(released) == 1


def test_grpc_moves_shards_between_gangs(config: TransferConfig) -> None:
    full = full_blocks(4, seed=3)
    source, dest = gang_stores(2, 4, full), gang_stores(4, 4, None)
    prefill = GrpcKVTransport(source[0], config, serve=True, rank_stores=source)
    decode = GrpcKVTransport(dest[0], config, serve=False, rank_stores=dest)
    try:
        handle = prefill.export(list(range(6)))
        decode.pull(handle, list(range(6, 12))).result(timeout_s=20)
        np.testing.assert_array_equal(gathered(dest, 4, list(range(6, 12))), full[:6])
        server = prefill.server
        assert server is not None
        assert wait_until(lambda: server.exporter.num_live_exports() == 0, 5)
    finally:
        decode.close()
        prefill.close()


def _join(*args: object) -> bytes:
    return b""
