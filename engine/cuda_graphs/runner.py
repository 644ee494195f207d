"""Decode steps replayed from CUDA graphs (vLLM-style), one graph per batch-size bucket.

A decode step of a small model is hundreds of short kernels whose launch cost exceeds their
work. :class:`CudaGraphRunner` records the step once per bucket while the engine is built and
afterwards replays it with a single launch: the step's values go into static buffers
(:mod:`engine.cuda_graphs.buffers`), padded to the bucket (:mod:`engine.cuda_graphs.buckets`),
and the graph's static logits come back. Prefill and mixed steps never come here.

The buckets are captured largest first into one shared memory pool, so the smaller graphs reuse
the larger ones' scratch memory. Capture needs every kernel compiled beforehand: each bucket runs
once eagerly first (Triton JIT, ``torch.compile`` specialisations, cuBLAS workspaces).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from engine.attention.metadata import AttentionMetadata
from engine.cuda_graphs.block_table_rows import BlockTableRows
from engine.cuda_graphs.buckets import PaddedDecode
from engine.cuda_graphs.buffers import DecodeBuffers

logger = logging.getLogger(__name__)

#: ``logits = step(input_ids [B], positions [B], meta, rows [B])`` -> [B, vocab] float32; writes
#: the step's K/V into the engine's cache (which the closure holds).
DecodeStep = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor], torch.Tensor]


class CudaGraphRunner:
    """Captured decode graphs for ``batch_sizes``; :meth:`replay` runs one padded step."""

    def __init__(
        self,
        step: DecodeStep,
        batch_sizes: Sequence[int],
        *,
        block_size: int,
        max_model_len: int,
        device: torch.device,
    ) -> None:
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        if not batch_sizes:
            raise ValueError("CUDA graphs need at least one batch size")
        self.batch_sizes = tuple(sorted(set(batch_sizes)))
        self.max_table_width = -(-max_model_len // block_size)
        self.buffers = DecodeBuffers(self.batch_sizes[-1], self.max_table_width, block_size, device)
        self.table_rows = BlockTableRows(2 * self.batch_sizes[-1], self.max_table_width, device)
        """The running requests' block tables, one persistent row each."""
        self._step = step
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._capture_all()

    def replay(
        self, padded: PaddedDecode, fill_inputs: Callable[[torch.Tensor], None] | None = None
    ) -> torch.Tensor:
        """Run the step of ``padded`` (written by :func:`pad_decode` for one of the buckets, over
        rows of :attr:`table_rows`); ``fill_inputs`` may then complete the static input ids
        [bucket] on the device (ids sampled by the step before). Returns the logits of its real
        rows [num_seqs, vocab] float32, a view of the graph's static output that the next replay
        overwrites."""
        graph, logits = self._graphs[padded.bucket]
        self.buffers.load(padded)
        if fill_inputs is not None:
            fill_inputs(self.buffers.input_ids[: padded.bucket])
        graph.replay()
        return logits[: padded.num_seqs]

    @torch.inference_mode()
    def _capture_all(self) -> None:
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for bucket in reversed(self.batch_sizes):
            args = self._args(bucket)
            self._derive_and_step(bucket, args)  # compile and warm every kernel first
            torch.cuda.synchronize(self.buffers.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self._derive_and_step(bucket, args)  # [bucket, vocab]
            self._graphs[bucket] = (graph, logits)
        torch.cuda.synchronize(self.buffers.device)
        logger.info(
            "captured %d CUDA graphs for decode batch sizes %s in %.1f s",
            len(self._graphs),
            list(self.batch_sizes),
            time.perf_counter() - start,
        )

    def _derive_and_step(
        self, bucket: int, args: tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]
    ) -> torch.Tensor:
        """What a graph records: positions, block tables and slots derived on the device from
        the loaded rows, then the decode step."""
        self.buffers.derive(bucket, self.table_rows.table)
        return self._step(*args)

    def _args(
        self, bucket: int
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        buffers = self.buffers
        return (
            buffers.input_ids[:bucket],
            buffers.positions[:bucket],
            buffers.metadata(bucket),
            buffers.all_rows[:bucket],
        )
