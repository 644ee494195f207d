"""Runs the model for one scheduler step: host lists in, logits of the sampling positions out.

The runner is the only place that turns a tensor-free :class:`SchedulerOutput` into tensors: the
flattened token ids and positions of every scheduled request, the attention metadata (block
tables, slot mapping) and the indices of the last position of each request that samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.metadata import AttentionMetadata
from engine.compiled_forward import CompiledForward
from engine.kv.storage import KVStorage
from engine.models import CausalLM
from engine.scheduler.output import ScheduledRequest


@dataclass(frozen=True)
class StepLogits:
    """Logits of the requests that sample this step, in batch order."""

    request_ids: list[str]
    logits: torch.Tensor  # [num_sampling, vocab] float32


class ModelRunner:
    """Owns the model and the KV storage of one engine; executes one step at a time."""

    def __init__(self, model: CausalLM, storage: KVStorage, *, compiled: bool = False) -> None:
        self.model = model
        self.storage = storage
        self.device = storage.device
        self.block_size = storage.layout.block_size
        self.compiled: CompiledForward | None = None
        if compiled:
            self.compiled = CompiledForward(model)
            self.compiled.warm_up(storage.kv, self.block_size)

    @torch.inference_mode()
    def execute(self, scheduled: list[ScheduledRequest]) -> StepLogits:
        """One forward over every scheduled token; logits only where a request samples."""
        token_ids: list[int] = []
        positions: list[int] = []
        sample_rows: list[int] = []
        sample_ids: list[str] = []
        for item in scheduled:
            token_ids.extend(item.token_ids)
            positions.extend(range(item.start_position, item.end_position))
            if item.samples_token:
                sample_rows.append(len(token_ids) - 1)
                sample_ids.append(item.request_id)
        meta = AttentionMetadata.build(
            query_lens=[item.num_new_tokens for item in scheduled],
            seq_lens=[item.end_position for item in scheduled],
            block_tables=[item.block_ids for item in scheduled],
            block_size=self.block_size,
            device=self.device,
        )
        input_ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)  # [T]
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)  # [T]
        if self.compiled is not None:
            # NOTE: always at least one row (the last token), so the graph never sees S == 0.
            rows = torch.tensor(sample_rows or [len(token_ids) - 1], device=self.device)
            logits = self.compiled(input_ids, pos, self.storage.kv, meta, rows)
            return StepLogits(sample_ids, logits if sample_rows else logits[:0])
        hidden = self.model(input_ids, pos, self.storage.kv, meta)  # [T, hidden]
        if not sample_rows:
            return StepLogits([], hidden.new_empty((0, 0), dtype=torch.float32))
        rows = torch.tensor(sample_rows, dtype=torch.long, device=self.device)
        logits = self.model.compute_logits(hidden.index_select(0, rows))  # [S, vocab]
        return StepLogits(sample_ids, logits)
