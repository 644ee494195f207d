"""Verifying drafted tokens: keep a prefix of the drafts, then one token of the target's own.

A request that speculated ran ``k`` draft tokens after its last known token in one step, so the
model gave logits at ``k + 1`` positions: position ``j`` scores the token after draft ``j - 1``.
Each position is processed exactly as the plain sampler would process it had the drafts before
it been sampled (logit bias, penalties counting those drafts, ``min_tokens`` masks), so:

- **greedy** rows accept draft ``j`` while it equals position ``j``'s argmax; the first
  mismatch (or, all accepted, the last position) yields the argmax there — token for token what
  decoding without drafts yields;
- **random** rows run speculative rejection sampling with a one-hot draft distribution (the
  draft-free proposers guess one token, with no probabilities): draft ``t`` at position ``j``
  is accepted with probability ``p_j(t)``, ``p_j`` the target distribution after temperature,
  top-k and top-p; the first rejected position draws from ``p_j`` with ``t`` removed and
  renormalised; when all are accepted the last position draws a bonus token from ``p_k``. Every
  emitted token is then distributed exactly as the target's (accept: ``p(t)``; otherwise
  ``(1 - p(t)) * p(x) / (1 - p(t)) = p(x)`` for ``x != t``).

A random row draws ``k + 1`` uniforms per verification from its own generator (or the
sampler's shared one): ``k`` for the accept tests, one for the final draw. Logprobs come from
the raw logits of each emitted token's position, as the plain sampler's do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from engine.device_io import upload
from engine.outputs import TokenLogprob
from engine.sampling import ops, penalties
from engine.sampling.row import SamplingRow
from engine.sampling.sampler import Sampler, banned_token_ids, is_greedy


@dataclass(frozen=True)
class DraftedRequest:
    """One request's verification: ``k`` drafts and ``k + 1`` rows (row ``j`` counts
    ``draft_token_ids[:j]`` among its output tokens)."""

    draft_token_ids: tuple[int, ...]
    rows: tuple[SamplingRow, ...]

    def __post_init__(self) -> None:
        if len(self.rows) != len(self.draft_token_ids) + 1:
            raise ValueError(
                f"{len(self.draft_token_ids)} drafts need {len(self.draft_token_ids) + 1} rows, "
                f"got {len(self.rows)}"
            )


@dataclass(frozen=True)
class VerifiedTokens:
    """What a verification yields: the accepted drafts, then one token of the target's."""

    token_ids: tuple[int, ...]
    num_accepted: int
    logprobs: tuple[TokenLogprob | None, ...]
    """One per token of ``token_ids`` (None unless the request asked for logprobs)."""
    finite: bool
    """Whether the logits of every position were finite (False fails the request)."""


@dataclass(frozen=True)
class _Decision:
    """One request's outcome on the host; a random row's final token is drawn on the device."""

    num_accepted: int
    final_token_id: int | None
    final_uniform: float


class RejectionSampler:
    """Verifies drafts against the target's logits; draws through a :class:`Sampler`'s
    generators."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def verify(
        self, logits: torch.Tensor, requests: Sequence[DraftedRequest]
    ) -> list[VerifiedTokens]:
        """``logits`` [R, V]: every request's ``k + 1`` rows, request after request."""
        num_rows = sum(len(r.rows) for r in requests)
        if logits.dim() != 2 or logits.shape[0] != num_rows:
            raise ValueError(f"logits {tuple(logits.shape)} do not match {num_rows} rows")
        logits = logits.float()
        rows = [row for r in requests for row in r.rows]
        processed = penalties.apply(logits, rows)
        masked = ops.mask_tokens(processed, [banned_token_ids(row) for row in rows])  # [R, V]
        starts = _starts(requests)
        probs, draft_probs = self._random_probs(masked, requests, starts)
        targets: list[int] = masked.argmax(dim=-1).tolist()  # [R]
        finite: list[bool] = torch.isfinite(logits.sum(dim=-1)).tolist()  # [R]
        decisions = [
            self._decide(request, targets[start : start + len(request.rows)], draft_probs.get(i))
            for i, (request, start) in enumerate(zip(requests, starts, strict=True))
        ]
        finals = self._draw_finals(requests, decisions, probs)
        results: list[VerifiedTokens] = []
        for i, (request, decision) in enumerate(zip(requests, decisions, strict=True)):
            accepted = request.draft_token_ids[: decision.num_accepted]
            token_ids = (*accepted, finals[i])
            start = starts[i]
            results.append(
                VerifiedTokens(
                    token_ids=token_ids,
                    num_accepted=decision.num_accepted,
                    logprobs=_logprobs(logits, start, token_ids, request),
                    finite=all(finite[start : start + len(request.rows)]),
                )
            )
        return results

    def _random_probs(
        self, masked: torch.Tensor, requests: Sequence[DraftedRequest], starts: list[int]
    ) -> tuple[dict[int, torch.Tensor], dict[int, list[float]]]:
        """For each random request (by index): its rows' target distributions [k + 1, V], and
        each draft's probability under its row (read to the host)."""
        random = [i for i, r in enumerate(requests) if not is_greedy(r.rows[0].params)]
        if not random:
            return {}, {}
        row_ids = [starts[i] + j for i in random for j in range(len(requests[i].rows))]
        params = [row.params for i in random for row in requests[i].rows]
        device = masked.device
        temperatures, top_ks, top_ps = ops.filter_params(params, device)
        index = upload(row_ids, torch.long, device)
        flat = ops.filtered_probs(masked.index_select(0, index), temperatures, top_ks, top_ps)
        probs: dict[int, torch.Tensor] = {}
        draft_rows: list[int] = []
        draft_ids: list[int] = []
        offset = 0
        for i in random:
            request = requests[i]
            probs[i] = flat[offset : offset + len(request.rows)]  # [k + 1, V]
            draft_rows.extend(range(offset, offset + len(request.draft_token_ids)))
            draft_ids.extend(request.draft_token_ids)
            offset += len(request.rows)
        gathered: list[float] = flat[  # [D]: each draft's probability at its position
            upload(draft_rows, torch.long, device), upload(draft_ids, torch.long, device)
        ].tolist()
        draft_probs: dict[int, list[float]] = {}
        offset = 0
        for i in random:
            num = len(requests[i].draft_token_ids)
            draft_probs[i] = gathered[offset : offset + num]
            offset += num
        return probs, draft_probs

    def _decide(
        self, request: DraftedRequest, targets: list[int], draft_probs: list[float] | None
    ) -> _Decision:
        drafts = request.draft_token_ids
        if draft_probs is None:  # greedy: the argmax decides
            num = _leading(d == t for d, t in zip(drafts, targets, strict=False))
            return _Decision(num, targets[num], 0.0)
        uniforms = self.sampler.draw_uniforms(request.rows[0].generator, len(drafts) + 1)
        num = _leading(u < p for u, p in zip(uniforms, draft_probs, strict=False))
        return _Decision(num, None, uniforms[-1])

    def _draw_finals(
        self,
        requests: Sequence[DraftedRequest],
        decisions: list[_Decision],
        probs: dict[int, torch.Tensor],
    ) -> list[int]:
        """Each request's last token: the argmax (greedy), else a draw from the residual
        distribution at the first rejection (the draft removed) or from the last position."""
        finals = [d.final_token_id if d.final_token_id is not None else -1 for d in decisions]
        drawing = [i for i, d in enumerate(decisions) if d.final_token_id is None]
        if not drawing:
            return finals
        residuals = []
        for i in drawing:
            num, drafts = decisions[i].num_accepted, requests[i].draft_token_ids
            rejected = drafts[num] if num < len(drafts) else None
            residuals.append(residual(probs[i][num], rejected))
        device = residuals[0].device
        uniforms = upload([decisions[i].final_uniform for i in drawing], torch.float64, device)
        drawn: list[int] = ops.draw(torch.stack(residuals), uniforms).tolist()
        for i, token_id in zip(drawing, drawn, strict=True):
            finals[i] = token_id
        return finals


def residual(probs: torch.Tensor, rejected_token_id: int | None) -> torch.Tensor:
    """What the final token is drawn from: ``probs`` [V] without the rejected draft (the
    draw renormalises), or all of it when every draft was accepted (the bonus token)."""
    if rejected_token_id is None:
        return probs
    out = probs.clone()
    out[rejected_token_id] = 0.0
    return out


def _starts(requests: Sequence[DraftedRequest]) -> list[int]:
    starts: list[int] = []
    offset = 0
    for request in requests:
        starts.append(offset)
        offset += len(request.rows)
    return starts


def _leading(flags: Iterable[bool]) -> int:
    """How many leading items of ``flags`` are true."""
    count = 0
    for flag in flags:
        if not flag:
            break
        count += 1
    return count


def _logprobs(
    logits: torch.Tensor,  # [R, V] raw, float32
    start: int,
    token_ids: tuple[int, ...],
    request: DraftedRequest,
) -> tuple[TokenLogprob | None, ...]:
    num_top = request.rows[0].params.logprobs
    if num_top is None:
        return (None,) * len(token_ids)
    rows = logits[start : start + len(token_ids)]
    chosen, ranks, top_ids, top_values = ops.top_logprobs(
        rows, upload(list(token_ids), torch.long, logits.device), num_top
    )
    chosen_list, ranks_list = chosen.tolist(), ranks.tolist()
    ids_list, values_list = top_ids.tolist(), top_values.tolist()
    return tuple(
        TokenLogprob(
            token_id=token_id,
            logprob=chosen_list[j],
            rank=ranks_list[j],
            top_token_ids=tuple(ids_list[j]),
            top_logprobs=tuple(values_list[j]),
        )
        for j, token_id in enumerate(token_ids)
    )
