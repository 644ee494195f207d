"""The ``draft_model`` method: a smaller model with the target's vocabulary drafts greedily.

:class:`DraftModelProposer` owns the draft model, its own paged KV (a block pool, a storage
tensor and one block table per drafting request) and a plain :class:`ModelRunner` over them.
A step's drafting is batched over every speculating request: one forward catches each
request's draft KV up with its tokens (the tokens accepted since its last drafts, or its whole
prompt the first time) and yields its first draft, then ``k - 1`` one-token forwards yield the
rest, each the argmax of the draft's logits. Rejected drafts are rolled back by keeping only
the KV of the longest common prefix of what the draft computed and the request's tokens now
(the blocks stay in the table and are overwritten); a request's blocks go back to the pool
when it ends, and a request whose table cannot grow drafts nothing that step.

The draft pool holds as many blocks as the target's plus one per running request, so it never
runs out before the target does (a draft model's rows are smaller, so it costs less memory).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from core.config import SpeculativeConfig
from core.errors import ConfigError
from core.sampling import SamplingParams
from engine.attention import get_backend
from engine.builtin import resolve_model
from engine.kv.block_pool import BlockPool
from engine.kv.storage import KVStorage
from engine.loader import load_model
from engine.model_runner import ModelRunner
from engine.models import ModelArchConfig
from engine.scheduler.output import ScheduledRequest
from engine.spec_decode import DraftQuery

logger = logging.getLogger(__name__)

_GREEDY = SamplingParams(temperature=0.0, max_tokens=1)
"""What the draft runner is told of each row (it only reads prompt_logprobs)."""


@dataclass(frozen=True)
class DraftTarget:
    """What the draft model must agree with or is sized from: the target engine's."""

    vocab_size: int
    device: torch.device
    dtype: torch.dtype
    block_size: int
    num_blocks: int
    max_num_seqs: int
    hash_seed: int


@dataclass
class _DraftSeq:
    """One request's draft KV: its block table and the tokens whose KV it holds."""

    block_ids: list[int] = field(default_factory=list)
    computed: list[int] = field(default_factory=list)


class DraftModelProposer:
    """The ``BatchProposer`` of ``method: draft_model`` (engine thread only)."""

    def __init__(self, config: SpeculativeConfig, target: DraftTarget) -> None:
        if config.model is None:
            raise ConfigError("method 'draft_model' needs model", param="speculative.model")
        model_dir = resolve_model(config.model)
        arch = ModelArchConfig.from_dir(model_dir)
        if arch.vocab_size != target.vocab_size:
            raise ConfigError(
                f"draft model {config.model!r} has a vocabulary of {arch.vocab_size} tokens, "
                f"the target's has {target.vocab_size}: a draft must share the target's "
                "vocabulary",
                param="speculative.model",
            )
        backend = get_backend("triton" if target.device.type == "cuda" else "torch")
        model = load_model(
            model_dir, dtype=target.dtype, device=target.device, attn_backend=backend
        )
        dtype_name = str(target.dtype).removeprefix("torch.")
        layout = arch.kv_layout(
            f"draft:{config.model}", dtype_name, target.block_size, target.hash_seed
        )
        num_blocks = target.num_blocks + target.max_num_seqs
        self.block_size = target.block_size
        self.pool = BlockPool(num_blocks)
        self.runner = ModelRunner(model, KVStorage(layout, num_blocks, target.device))
        self._seqs: dict[str, _DraftSeq] = {}

    @property
    def num_drafting_requests(self) -> int:
        """Requests holding draft KV now."""
        return len(self._seqs)

    def propose_batch(self, queries: Sequence[DraftQuery]) -> list[list[int]]:
        """Up to ``max_num_tokens`` greedy drafts per query, all queries in each forward."""
        drafts: dict[str, list[int]] = {q.request_id: [] for q in queries}
        rows = [self._catch_up(q) for q in queries if q.max_num_tokens > 0 and q.token_ids]
        live = [row for row in rows if row is not None]
        step = 0
        while live:
            logits = self.runner.execute([row for _, row in live])  # [S, vocab]
            token_ids = logits.logits.argmax(dim=-1).tolist()
            going: list[tuple[DraftQuery, ScheduledRequest]] = []
            for (query, row), token_id in zip(live, token_ids, strict=True):
                drafts[query.request_id].append(token_id)
                seq = self._seqs[query.request_id]
                seq.computed.extend(row.token_ids)
                if step + 1 < query.max_num_tokens:
                    nxt = self._row(query.request_id, seq, [token_id])
                    if nxt is not None:
                        going.append((query, nxt))
            live = going
            step += 1
        return [drafts[q.request_id] for q in queries]

    def finish(self, request_id: str) -> None:
        """Give the request's draft blocks back (idempotent)."""
        seq = self._seqs.pop(request_id, None)
        if seq is not None and seq.block_ids:
            self.pool.free(seq.block_ids)

    def check_integrity(self) -> None:
        """Every block is free or in exactly one request's table."""
        self.pool.check_integrity()
        held = [b for seq in self._seqs.values() for b in seq.block_ids]
        if len(held) != len(set(held)):
            raise AssertionError("a draft block is in two tables")
        if self.pool.num_used_blocks != len(held):
            raise AssertionError(
                f"{self.pool.num_used_blocks} draft blocks used, {len(held)} in tables"
            )

    def _catch_up(self, query: DraftQuery) -> tuple[DraftQuery, ScheduledRequest] | None:
        """The row that computes the KV of ``query``'s tokens the draft does not hold yet
        (rolled back to the longest prefix it holds), its last position sampling."""
        seq = self._seqs.setdefault(query.request_id, _DraftSeq())
        tokens = query.token_ids
        keep = 0
        limit = min(len(seq.computed), len(tokens) - 1)
        while keep < limit and seq.computed[keep] == tokens[keep]:
            keep += 1
        del seq.computed[keep:]  # the rejected drafts' KV: overwritten next
        row = self._row(query.request_id, seq, list(tokens[keep:]))
        return None if row is None else (query, row)

    def _row(
        self, request_id: str, seq: _DraftSeq, token_ids: list[int]
    ) -> ScheduledRequest | None:
        """``token_ids`` after ``seq``'s computed tokens, its table grown to hold them; None
        when the pool cannot (the request drafts no further this step)."""
        start = len(seq.computed)
        num_needed = -(-(start + len(token_ids)) // self.block_size) - len(seq.block_ids)
        if num_needed > 0:
            if not self.pool.can_allocate(num_needed):
                logger.debug("request %s: draft KV pool full, no more drafts", request_id)
                return None
            seq.block_ids.extend(self.pool.allocate(num_needed))
        return ScheduledRequest(
            request_id=request_id,
            token_ids=token_ids,
            start_position=start,
            block_ids=list(seq.block_ids),
            samples_token=True,
            sampling_params=_GREEDY,
            num_output_tokens=0,
        )
