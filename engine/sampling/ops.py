"""Batched tensor operations of the sampler: token masks, top-k/top-p filtering, drawing, logprobs.

Every function works row-wise on a ``[B, V]`` float32 batch, so a row's result never depends on
which other rows share the batch. Random draws take one uniform per row (inverse-CDF sampling),
which the caller produces from that row's own generator.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from core.sampling import SamplingParams
from engine.device_io import upload


def mask_tokens(logits: torch.Tensor, token_ids_per_row: Sequence[Sequence[int]]) -> torch.Tensor:
    """``logits`` [B, V], copied if changed, with each row's listed ids (< V) set to -inf."""
    vocab_size = logits.shape[-1]
    rows: list[int] = []
    cols: list[int] = []
    for row, token_ids in enumerate(token_ids_per_row):
        for token_id in token_ids:
            if 0 <= token_id < vocab_size:
                rows.append(row)
                cols.append(token_id)
    if not rows:
        return logits
    masked = logits.clone()
    row_idx = upload(rows, torch.long, logits.device)
    col_idx = upload(cols, torch.long, logits.device)
    masked[row_idx, col_idx] = float("-inf")
    return masked


def sample_from_logits(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor | None,
    top_ps: torch.Tensor | None,
    uniforms: torch.Tensor,
) -> torch.Tensor:
    """Draw one token id per row [B] from ``softmax(logits / t)`` filtered by top-k and top-p.

    ``temperatures`` [B] > 0; ``top_ks`` [B] int (k >= V or k <= 0 keeps all) or None;
    ``top_ps`` [B] in (0, 1] or None; ``uniforms`` [B] float64 in [0, 1).
    """
    scaled = logits / temperatures.unsqueeze(1)  # [B, V]
    if top_ks is None and top_ps is None:
        return _inverse_cdf(torch.softmax(scaled, dim=-1), uniforms)
    sorted_logits, sorted_ids = scaled.sort(dim=-1, descending=True)  # [B, V] each
    if top_ks is not None:
        sorted_logits = _apply_top_k(sorted_logits, top_ks)
    probs = torch.softmax(sorted_logits, dim=-1)  # [B, V], descending
    if top_ps is not None:
        probs = _apply_top_p(probs, top_ps)
    positions = _inverse_cdf(probs, uniforms)  # [B]
    return sorted_ids.gather(1, positions.unsqueeze(1)).squeeze(1)


def filter_params(
    params: Sequence[SamplingParams], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The rows' temperatures [R], and their top-k [R] / top-p [R] (None when no row filters
    that way), on ``device``: the filters :func:`filtered_probs` takes."""
    temperatures = upload([p.temperature for p in params], torch.float32, device)
    top_ks = None
    if any(p.top_k > 0 for p in params):
        top_ks = upload([p.top_k for p in params], torch.long, device)
    top_ps = None
    if any(p.top_p < 1.0 for p in params):
        top_ps = upload([p.top_p for p in params], torch.float32, device)
    return temperatures, top_ks, top_ps


def filtered_probs(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ks: torch.Tensor | None,
    top_ps: torch.Tensor | None,
) -> torch.Tensor:
    """The distribution [B, V] (vocabulary order, rows sum to 1) that
    :func:`sample_from_logits` draws from with the same arguments."""
    scaled = logits / temperatures.unsqueeze(1)  # [B, V]
    if top_ks is None and top_ps is None:
        return torch.softmax(scaled, dim=-1)
    sorted_logits, sorted_ids = scaled.sort(dim=-1, descending=True)  # [B, V] each
    if top_ks is not None:
        sorted_logits = _apply_top_k(sorted_logits, top_ks)
    probs = torch.softmax(sorted_logits, dim=-1)  # [B, V], descending
    if top_ps is not None:
        probs = _apply_top_p(probs, top_ps)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(1, sorted_ids, probs)


def draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One index [B] per row of ``probs`` [B, V] (non-negative, not necessarily normalised)
    by inverse-CDF sampling with ``uniforms`` [B] in [0, 1)."""
    return _inverse_cdf(probs, uniforms)


def _apply_top_k(sorted_logits: torch.Tensor, top_ks: torch.Tensor) -> torch.Tensor:
    """Keep logits >= the k-th largest (ties at the k-th value are all kept, as in HF)."""
    vocab_size = sorted_logits.shape[-1]
    k = torch.where((top_ks <= 0) | (top_ks > vocab_size), vocab_size, top_ks)  # [B]
    kth_value = sorted_logits.gather(1, (k - 1).unsqueeze(1))  # [B, 1]
    return sorted_logits.masked_fill(sorted_logits < kth_value, float("-inf"))


def _apply_top_p(sorted_probs: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """Zero the tail whose preceding mass already reaches ``p``; the top token always stays."""
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [B, V]
    drop = (mass_before >= top_ps.unsqueeze(1)) & (top_ps < 1.0).unsqueeze(1)
    return sorted_probs.masked_fill(drop, 0.0)


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index [B] of the token whose CDF interval holds ``u * total`` (unnormalised probs).

    NOTE: the target is kept strictly below the total mass, so the index always lands on a token
    with non-zero probability (never past the end onto a masked token).
    """
    cdf = probs.cumsum(dim=-1)  # [B, V]
    total = cdf[:, -1:]  # [B, 1]
    target = uniforms.to(probs.dtype).unsqueeze(1) * total  # [B, 1]
    target = torch.minimum(target, torch.nextafter(total, torch.zeros_like(total)))
    positions = torch.searchsorted(cdf, target, right=True).squeeze(1)  # [B]
    return positions.clamp_(max=probs.shape[-1] - 1)


def top_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, num_top: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-softmax of ``logits`` [B, V]: chosen tokens' values [B] and vocabulary ranks [B]
    (1 = most likely; ties share the better rank), top-n ids and values [B, n]."""
    logprobs = torch.log_softmax(logits, dim=-1)  # [B, V]
    chosen = logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1)  # [B]
    ranks = (logprobs > chosen.unsqueeze(1)).sum(dim=-1) + 1  # [B]
    top_values, top_ids = logprobs.topk(num_top, dim=-1)  # [B, n] each
    return chosen, ranks, top_ids, top_values
