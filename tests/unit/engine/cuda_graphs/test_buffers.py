"""The static decode buffers a CUDA graph reads and the persistent block-table rows they gather
from, exercised on CPU tensors."""

from __future__ import annotations

import pytest
import torch

from engine.cuda_graphs import DecodeBuffers, pad_decode
from engine.cuda_graphs.block_table_rows import BlockTableRows
from engine.cuda_graphs.buckets import PADDING_ROW

CPU = torch.device("cpu")


def buffers() -> DecodeBuffers:
    return DecodeBuffers(max_batch=8, max_table_width=6, block_size=4, device=CPU)


def test_load_and_derive_fill_the_bucket_rows_and_keep_addresses() -> None:
    static = buffers()
    table_rows = BlockTableRows(max_rows=4, width=6, device=CPU)
    meta = static.metadata(4)
    addresses = [t.data_ptr() for t in (meta.seq_lens, meta.block_tables, meta.slot_mapping)]
    tables = [("a", [7, 3]), ("b", [2]), ("c", [4, 6, 8])]
    rows = table_rows.rows(tables)
    padded = pad_decode(
        [11, 12, 13], [5, 1, 9], [2, 1, 3], rows, bucket=4, block_size=4, max_table_width=6
    )
    static.load(padded)
    static.derive(4, table_rows.table)
    meta = static.metadata(4)
    # the graph recorded these addresses: a load must write into them, never reallocate
    assert [t.data_ptr() for t in (meta.seq_lens, meta.block_tables, meta.slot_mapping)] == (
        addresses
    )
    assert static.input_ids[:4].tolist() == [11, 12, 13, 0]
    assert static.positions[:4].tolist() == [4, 0, 8, 0]
    assert meta.seq_lens.tolist() == [5, 1, 9, 1]
    # slot = block_id * 4 + position % 4 of the new token; padding never writes (-1)
    assert meta.slot_mapping.tolist() == [3 * 4 + 0, 2 * 4 + 0, 8 * 4 + 0, -1]
    assert meta.block_tables[:, :3].tolist() == [[7, 3, 0], [2, 0, 0], [4, 6, 8], [0, 0, 0]]
    assert meta.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    assert meta.decode_only and meta.num_seqs == 4 and meta.num_tokens == 4


def test_fresh_buffers_hold_padding_rows() -> None:
    static = buffers()
    static.derive(8, BlockTableRows(max_rows=8, width=6, device=CPU).table)
    meta = static.metadata(8)  # what the capture and its warm-up run over
    assert (meta.slot_mapping == -1).all()  # no KV write anywhere
    assert (meta.seq_lens == 1).all() and (meta.block_tables == 0).all()


def test_refuses_buckets_and_widths_beyond_the_buffers() -> None:
    static = buffers()
    with pytest.raises(ValueError, match="bucket 9"):
        static.metadata(9)
    with pytest.raises(ValueError, match="bucket 0"):
        static.metadata(0)
    with pytest.raises(ValueError, match="static width 6"):
        static.derive(1, BlockTableRows(max_rows=1, width=8, device=CPU).table)
    with pytest.raises(ValueError, match="exceed the table width 6"):
        BlockTableRows(max_rows=1, width=6, device=CPU).rows([("x", list(range(1, 8)))])


def test_rows_write_only_what_changed() -> None:
    table_rows = BlockTableRows(max_rows=3, width=5, device=CPU)
    assert table_rows.rows([("a", [4, 5]), ("b", [9])]) == [1, 2]
    assert table_rows.num_written_entries == 3
    assert table_rows.rows([("a", [4, 5]), ("b", [9])]) == [1, 2]  # nothing new
    assert table_rows.num_written_entries == 3
    assert table_rows.rows([("b", [9, 10]), ("a", [4, 5, 6])]) == [2, 1]  # one block each
    assert table_rows.num_written_entries == 5
    # a table changed in place (a sliding window nulled its first block): the row is rewritten
    assert table_rows.rows([("a", [0, 5, 6])]) == [1]
    assert table_rows.num_written_entries == 8
    assert table_rows.table[1, :3].tolist() == [0, 5, 6]
    assert table_rows.table[2, :2].tolist() == [9, 10]
    assert table_rows.table[PADDING_ROW].tolist() == [0] * 5


def test_released_rows_are_reused_and_a_missed_release_does_not_run_out() -> None:
    table_rows = BlockTableRows(max_rows=2, width=4, device=CPU)
    assert table_rows.rows([("a", [1]), ("b", [2])]) == [1, 2]
    table_rows.release(["a", "unknown"])
    assert table_rows.num_free_rows == 1
    assert table_rows.rows([("c", [3, 4])]) == [1]  # a's row, rewritten
    assert table_rows.table[1, :2].tolist() == [3, 4]
    # b and c ended but nobody said so: a step of two new requests evicts rows not in it
    assert sorted(table_rows.rows([("d", [5]), ("e", [6])])) == [1, 2]
    with pytest.raises(ValueError, match="more than 2 requests"):
        table_rows.rows([("f", [1]), ("g", [2]), ("h", [3])])
