"""The static decode buffers a CUDA graph reads, exercised on CPU tensors."""

from __future__ import annotations

import pytest
import torch

from engine.cuda_graphs import DecodeBuffers, pad_decode


def buffers() -> DecodeBuffers:
    return DecodeBuffers(max_batch=8, max_table_width=6, block_size=4, device=torch.device("cpu"))


def test_load_fills_the_bucket_rows_and_keeps_addresses() -> None:
    static = buffers()
    meta = static.metadata(4)
    addresses = [t.data_ptr() for t in (meta.seq_lens, meta.block_tables, meta.slot_mapping)]
    static.block_tables.fill_(9)  # stale ids from an earlier, longer step
    padded = pad_decode(
        [11, 12, 13], [5, 1, 9], [[7, 3], [2], [4, 6, 8]], bucket=4, block_size=4, max_table_width=6
    )
    static.load(padded)
    meta = static.metadata(4)
    # the graph recorded these addresses: a load must write into them, never reallocate
    assert [t.data_ptr() for t in (meta.seq_lens, meta.block_tables, meta.slot_mapping)] == (
        addresses
    )
    assert static.input_ids[:4].tolist() == [11, 12, 13, 0]
    assert static.positions[:4].tolist() == [4, 0, 8, 0]
    assert meta.seq_lens.tolist() == [5, 1, 9, 1]
    assert meta.slot_mapping.tolist() == [12, 8, 32, -1]
    assert meta.block_tables[:, :3].tolist() == [[7, 3, 0], [2, 0, 0], [4, 6, 8], [0, 0, 0]]
    assert (meta.block_tables[:, 3:] == 9).all()  # past every context: never read, left stale
    assert (static.block_tables[4:] == 9).all()  # rows beyond the bucket untouched
    assert meta.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    assert meta.decode_only and meta.num_seqs == 4 and meta.num_tokens == 4
    assert meta.block_size == 4


def test_fresh_buffers_hold_padding_rows() -> None:
    meta = buffers().metadata(8)  # what the capture and its warm-up run over
    assert (meta.slot_mapping == -1).all()  # no KV write anywhere
    assert (meta.seq_lens == 1).all() and (meta.block_tables == 0).all()


def test_refuses_buckets_and_widths_beyond_the_buffers() -> None:
    static = buffers()
    with pytest.raises(ValueError, match="bucket 9"):
        static.metadata(9)
    with pytest.raises(ValueError, match="bucket 0"):
        static.metadata(0)
    wide = pad_decode([1], [29], [list(range(1, 9))], bucket=1, block_size=4, max_table_width=8)
    with pytest.raises(ValueError, match="static width 6"):
        static.load(wide)
