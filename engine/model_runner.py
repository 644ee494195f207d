"""Runs the model for one scheduler step: host lists in, logits of the sampling positions out.

The runner is the only place that turns a tensor-free :class:`SchedulerOutput` into tensors: the
flattened token ids and positions of every scheduled request, the attention metadata (block
tables, slot mapping) and the indices of the last position of each request that samples.

Three ways to run a step: eagerly, through the compiled model (``compile_model``), or — for a
decode step that fits a captured bucket, on CUDA — by replaying a CUDA graph
(:mod:`engine.cuda_graphs`), which records the eager or the compiled forward. A step with a
verify row (a request's last token plus its draft tokens, speculative decoding) is multi-token,
so it runs eagerly or compiled like a chunked prefill: no graph buckets for verify steps yet.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from engine.attention.metadata import AttentionMetadata
from engine.compiled_forward import CompiledForward
from engine.cuda_graphs import CudaGraphRunner, pad_decode, pick_bucket
from engine.device_io import upload
from engine.kv.storage import KVStorage
from engine.lora import LoRAManager
from engine.models import CausalLM
from engine.scheduler.output import PENDING_TOKEN_ID, ScheduledRequest


@dataclass(frozen=True)
class PendingTokens:
    """The previous step's sampled ids, still on the device: row ``rows[request_id]`` of
    ``token_ids`` is that request's token (overlapped steps)."""

    rows: Mapping[str, int]
    token_ids: torch.Tensor  # [S] int64, on the model's device


@dataclass(frozen=True)
class StepLogits:
    """Logits of the requests that sample this step, in batch order."""

    request_ids: list[str]
    logits: torch.Tensor  # [num_sampling, vocab] float32
    prompt_logits: dict[str, tuple[int, torch.Tensor]] = field(default_factory=dict)
    """Requests asking for prompt logprobs: (first position, logits [chunk tokens, vocab]) of
    every position this step computed for them."""
    verify_logits: dict[str, torch.Tensor] = field(default_factory=dict)
    """Verify rows (requests with draft tokens; not in ``request_ids``): logits
    [k + 1, vocab] float32 of the last known token's and each draft's position."""


class ModelRunner:
    """Owns the model and the KV storage of one engine; executes one step at a time.

    ``graph_batch_sizes`` (CUDA only; empty: none) are the decode batch sizes captured as CUDA
    graphs now, sized for contexts of up to ``max_model_len`` tokens.
    """

    def __init__(
        self,
        model: CausalLM,
        storage: KVStorage,
        *,
        compiled: bool = False,
        graph_batch_sizes: Sequence[int] = (),
        max_model_len: int | None = None,
        lora: LoRAManager | None = None,
    ) -> None:
        self.model = model
        self.lora = lora  # publishes each step's row -> adapter slot mapping to the model
        self.storage = storage
        self.device = storage.device
        self.block_size = storage.layout.block_size
        self.compiled: CompiledForward | None = None
        if compiled:
            self.compiled = CompiledForward(model)
            self.compiled.warm_up(storage.kv, self.block_size)
        self.graphs: CudaGraphRunner | None = None
        if graph_batch_sizes:
            if max_model_len is None:
                raise ValueError("CUDA graphs need max_model_len to size their block tables")
            self.graphs = CudaGraphRunner(
                self._all_logits,
                graph_batch_sizes,
                block_size=self.block_size,
                max_model_len=max_model_len,
                device=self.device,
            )

    @torch.inference_mode()
    def execute(
        self, scheduled: list[ScheduledRequest], pending: PendingTokens | None = None
    ) -> StepLogits:
        """One forward over every scheduled token; logits only where a request samples.
        :data:`PENDING_TOKEN_ID` inputs take their ids from ``pending`` on the device."""
        self.storage.fence_uploads()  # imported KV still copying in: order it before the step
        if self.lora is not None:
            self.lora.prepare_step(scheduled)
        replayed = self._replay(scheduled, pending)
        if replayed is not None:
            return replayed
        wanted = [i for i in scheduled if i.sampling_params.prompt_logprobs is not None]
        token_ids: list[int] = []
        positions: list[int] = []
        sample_rows: list[int] = []
        sample_ids: list[str] = []
        verify_rows: dict[str, list[int]] = {}
        for item in scheduled:
            token_ids.extend(item.token_ids)
            positions.extend(range(item.start_position, item.end_position))
            if item.draft_token_ids:
                first = len(token_ids) - len(item.draft_token_ids) - 1
                verify_rows[item.request_id] = list(range(first, len(token_ids)))
            elif item.samples_token:
                sample_rows.append(len(token_ids) - 1)
                sample_ids.append(item.request_id)
        meta = AttentionMetadata.build(
            query_lens=[item.num_new_tokens for item in scheduled],
            seq_lens=[item.end_position for item in scheduled],
            block_tables=[item.block_ids for item in scheduled],
            block_size=self.block_size,
            device=self.device,
        )
        input_ids = upload(token_ids, torch.long, self.device)  # [T]
        self._fill_pending(input_ids, scheduled, pending)
        pos = upload(positions, torch.long, self.device)  # [T]
        logit_rows = sample_rows + [row for rows in verify_rows.values() for row in rows]
        if self.compiled is not None and not wanted:
            # NOTE: always at least one row (the last token), so the graph never sees S == 0.
            rows = upload(logit_rows or [len(token_ids) - 1], torch.long, self.device)
            logits = self.compiled(input_ids, pos, self.storage.kv, meta, rows)
            return _split(sample_ids, logits if logit_rows else logits[:0], verify_rows, {})
        hidden = self.model(input_ids, pos, self.storage.kv, meta)  # [T, hidden]
        prompt_logits = self._prompt_logits(scheduled, wanted, hidden)
        if not logit_rows:
            empty = hidden.new_empty((0, 0), dtype=torch.float32)
            return StepLogits([], empty, prompt_logits)
        rows = upload(logit_rows, torch.long, self.device)
        logits = self.model.compute_logits(hidden.index_select(0, rows))  # [S + verify, vocab]
        return _split(sample_ids, logits, verify_rows, prompt_logits)

    def _fill_pending(
        self,
        input_ids: torch.Tensor,  # [T] int64 on the device
        scheduled: Sequence[ScheduledRequest],
        pending: PendingTokens | None,
    ) -> None:
        """Write the ids of :data:`PENDING_TOKEN_ID` inputs from the previous step's samples,
        on the device (the host never learns them first)."""
        # NOTE: a pending id is always an item's last input (the one token sampled on the
        # device), so a prefill chunk's tokens are never scanned one by one.
        positions: list[int] = []
        rows: list[int] = []
        offset = 0
        for item in scheduled:
            offset += item.num_new_tokens
            if item.token_ids[-1] != PENDING_TOKEN_ID:
                continue
            if pending is None or item.request_id not in pending.rows:
                raise ValueError(f"request {item.request_id}: no sampled id pending")
            positions.append(offset - 1)
            rows.append(pending.rows[item.request_id])
        if not positions:
            return
        assert pending is not None  # for mypy: positions imply it
        sources = pending.token_ids.index_select(0, upload(rows, torch.long, self.device))
        input_ids.index_copy_(0, upload(positions, torch.long, self.device), sources)

    def release(self, request_ids: Sequence[str]) -> None:
        """Forget per-request state of requests that ended or were preempted (their rows of
        the persistent block table)."""
        if self.graphs is not None and request_ids:
            self.graphs.table_rows.release(request_ids)

    def close(self) -> None:
        """Release what outlives the engine's steps (nothing here; a tensor-parallel leader
        stops its followers)."""

    @property
    def usable(self) -> bool:
        """False once no step can ever succeed again (a tensor-parallel gang that broke)."""
        return True

    @property
    def rank_storages(self) -> tuple[KVStorage, ...]:
        """Every tensor-parallel rank's KV storage as this process reaches it, this one's
        first (one rank: just :attr:`storage`)."""
        return (self.storage,)

    def _prompt_logits(
        self,
        scheduled: list[ScheduledRequest],
        wanted: list[ScheduledRequest],
        hidden: torch.Tensor,
    ) -> dict[str, tuple[int, torch.Tensor]]:
        """Every computed position's logits for the requests that asked for prompt logprobs."""
        out: dict[str, tuple[int, torch.Tensor]] = {}
        if not wanted:
            return out
        offset = 0
        for item in scheduled:
            if item.sampling_params.prompt_logprobs is not None:
                rows = hidden[offset : offset + item.num_new_tokens]
                out[item.request_id] = (item.start_position, self.model.compute_logits(rows))
            offset += item.num_new_tokens
        return out

    def _replay(
        self, scheduled: list[ScheduledRequest], pending: PendingTokens | None
    ) -> StepLogits | None:
        """The step through a captured graph; None when it is not a decode step of a bucket."""
        if self.graphs is None or any(item.num_new_tokens != 1 for item in scheduled):
            return None
        bucket = pick_bucket(len(scheduled), self.graphs.batch_sizes)
        if bucket is None:
            return None
        tables = [(item.request_id, item.block_ids) for item in scheduled]
        padded = pad_decode(
            [item.token_ids[0] for item in scheduled],
            [item.end_position for item in scheduled],
            [len(item.block_ids) for item in scheduled],
            self.graphs.table_rows.rows(tables),
            bucket=bucket,
            block_size=self.block_size,
            max_table_width=self.graphs.max_table_width,
        )
        logits = self.graphs.replay(  # [B, vocab], the graph's static output
            padded, lambda input_ids: self._fill_pending(input_ids, scheduled, pending)
        )
        rows = [i for i, item in enumerate(scheduled) if item.samples_token]
        ids = [scheduled[i].request_id for i in rows]
        # a copy the next replay leaves alone: [S, vocab]
        if len(rows) == len(scheduled):
            return StepLogits(ids, logits.clone())
        return StepLogits(ids, logits.index_select(0, upload(rows, torch.long, self.device)))

    def _all_logits(
        self,
        input_ids: torch.Tensor,  # [B] int64
        positions: torch.Tensor,  # [B] int64
        meta: AttentionMetadata,
        rows: torch.Tensor,  # [B] int64, every row
    ) -> torch.Tensor:  # [B, vocab] float32
        """The decode step a graph records: the compiled forward when there is one."""
        if self.compiled is not None:
            return self.compiled(input_ids, positions, self.storage.kv, meta, rows)
        hidden = self.model(input_ids, positions, self.storage.kv, meta)  # [B, hidden]
        return self.model.compute_logits(hidden)


def _split(
    sample_ids: list[str],
    logits: torch.Tensor,  # [S + sum(k + 1), vocab]: sampling rows, then each verify row's
    verify_rows: Mapping[str, Sequence[int]],
    prompt_logits: dict[str, tuple[int, torch.Tensor]],
) -> StepLogits:
    """The step's logits as :class:`StepLogits`: the first ``len(sample_ids)`` rows sample,
    each verify row's ``k + 1`` follow in ``verify_rows`` order."""
    num_sampling = len(sample_ids)
    verify: dict[str, torch.Tensor] = {}
    offset = num_sampling
    for request_id, rows in verify_rows.items():
        verify[request_id] = logits[offset : offset + len(rows)]
        offset += len(rows)
    return StepLogits(sample_ids, logits[:num_sampling], prompt_logits, verify)
