"""Which decode batch sizes get a CUDA graph, and how a step's batch is padded to one.

Pure arithmetic, no torch: a graph replays fixed shapes, so the runner captures one graph per
*bucket* (a batch size) and pads a decode step of ``B`` requests to the smallest bucket
``>= B``. The padding rows compute garbage that nobody reads: they write no KV (slot -1) and
attend over one slot of the padding block 0, so they cannot disturb a real request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: The smallest buckets, then every multiple of this step (vLLM's choice: few graphs, at most
#: 7 padding rows per step beyond batch 8).
SMALL_BUCKETS = (1, 2, 4)
BUCKET_STEP = 8


def default_batch_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """1, 2, 4 and every multiple of 8 up to ``max_num_seqs`` (which is always included)."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    sizes = {s for s in SMALL_BUCKETS if s <= max_num_seqs}
    sizes.update(range(BUCKET_STEP, max_num_seqs + 1, BUCKET_STEP))
    sizes.add(max_num_seqs)
    return tuple(sorted(sizes))


def graph_batch_sizes(
    configured: Sequence[int] | None,
    *,
    max_num_seqs: int,
    enforce_eager: bool,
    on_cuda: bool,
    backend_supports_graphs: bool,
    moe_syncs_host: bool,
) -> tuple[int, ...]:
    """The buckets an engine captures; empty means every step runs eagerly.

    Graphs need CUDA, an attention backend that reads every length from its metadata tensors
    (Triton; the torch reference loops over host lists) and a model without data-dependent host
    syncs. ``moe_syncs_host``: the model has MoE layers whose experts read routing counts on the
    host — the torch loop over experts sizes each matmul from them, and an expert-parallel rank's
    all-to-all is a host-driven collective — so it stays eager. The fused MoE (grouped GEMMs
    over an on-device row layout) syncs nothing and a single-rank MoE model is captured.
    """
    if enforce_eager or not on_cuda or not backend_supports_graphs or moe_syncs_host:
        return ()
    if configured is None:
        return default_batch_sizes(max_num_seqs)
    return tuple(sorted(set(configured)))


def moe_syncs_host(*, is_moe: bool, fused_kernels: bool, expert_parallel: bool) -> bool:
    """Whether a model's MoE layers read routing counts on the host each step: with the torch
    loop over experts, and on an expert-parallel rank (its all-to-all exchanges row counts
    through a host-driven collective) even with the fused experts. Dense models never do."""
    return is_moe and (expert_parallel or not fused_kernels)


def pick_bucket(num_seqs: int, sizes: Sequence[int]) -> int | None:
    """The smallest bucket that holds ``num_seqs`` rows; None when none does (run eagerly)."""
    if num_seqs < 1:
        return None
    return next((size for size in sorted(sizes) if size >= num_seqs), None)


PADDING_SLOT = -1  # the KV write kernel skips negative slots
PADDING_SEQ_LEN = 1  # a padding row attends over one slot of the padding block 0
PADDING_BLOCK = 0
PADDING_ROW = 0  # the row of the persistent block table that holds only the padding block


@dataclass(frozen=True)
class PaddedDecode:
    """One decode step laid out for a bucket: the ``num_seqs`` real rows, then padding rows.

    Every list has ``bucket`` entries: each row's input token, context length after the step,
    and its row in the persistent block table (:mod:`engine.cuda_graphs.block_table_rows`);
    positions, slots and the step's block tables are derived from those on the device.
    """

    bucket: int
    num_seqs: int
    token_ids: list[int]
    seq_lens: list[int]
    rows: list[int]

    @property
    def num_padding(self) -> int:
        """Rows added to reach the bucket."""
        return self.bucket - self.num_seqs


def pad_decode(
    token_ids: Sequence[int],
    seq_lens: Sequence[int],
    num_table_blocks: Sequence[int],
    rows: Sequence[int],
    *,
    bucket: int,
    block_size: int,
    max_table_width: int,
) -> PaddedDecode:
    """Lay out a decode step (one new token per sequence, at position ``seq_len - 1``; each
    sequence's table holds ``num_table_blocks`` blocks, in block-table row ``rows[i]``) for
    ``bucket`` rows; ``ValueError`` when it does not fit the bucket or the static table."""
    num_seqs = len(token_ids)
    if not (num_seqs == len(seq_lens) == len(num_table_blocks) == len(rows)):
        raise ValueError("token_ids, seq_lens, tables and rows must have one entry per sequence")
    if not 1 <= num_seqs <= bucket:
        raise ValueError(f"{num_seqs} sequences do not fit a bucket of {bucket}")
    for seq_len, held in zip(seq_lens, num_table_blocks, strict=True):
        needed = -(-seq_len // block_size)
        if seq_len < 1 or needed > held or needed > max_table_width:
            raise ValueError(
                f"a context of {seq_len} tokens does not fit {held} blocks of {block_size} "
                f"(static table width {max_table_width})"
            )
    num_padding = bucket - num_seqs
    return PaddedDecode(
        bucket=bucket,
        num_seqs=num_seqs,
        token_ids=[*token_ids, *[0] * num_padding],
        seq_lens=[*seq_lens, *[PADDING_SEQ_LEN] * num_padding],
        rows=[*rows, *[PADDING_ROW] * num_padding],
    )
