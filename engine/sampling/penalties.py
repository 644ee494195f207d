"""``logit_bias`` and the presence, frequency and repetition penalties, row by row.

As vLLM (and the OpenAI API) define them: ``logit_bias`` adds a fixed value to the listed
tokens' logits; ``presence_penalty`` subtracts a constant from every token that already appears
in the output, ``frequency_penalty`` that many times per appearance; ``repetition_penalty``
(the CTRL / HF rule) divides a positive logit and multiplies a negative one by the penalty for
every token seen in the prompt or the output. Only the output's and the prompt's token ids are
needed, so a decode replica continuing a prefill's request recomputes the same counts from the
ids it imports — no penalty state crosses the KV handoff.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.device_io import upload
from engine.sampling.row import SamplingRow


def apply(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
    """``logits`` [B, V], copied if any row changes it, with each row's bias and penalties."""
    changed = [i for i, row in enumerate(rows) if row.params.logit_bias or row.params.penalized]
    if not changed:
        return logits
    out = logits.clone()
    vocab_size = logits.shape[-1]
    for i in changed:
        params = rows[i].params
        row = out[i]
        if params.logit_bias:
            ids = upload([t for t, _ in params.logit_bias], torch.long, row.device)
            bias = upload([b for _, b in params.logit_bias], row.dtype, row.device)
            row.index_add_(0, ids, bias)
        if not params.penalized:
            continue
        output = torch.tensor(list(rows[i].output_token_ids), dtype=torch.long)
        counts = torch.bincount(output, minlength=vocab_size)[:vocab_size].to(row.device)
        if params.repetition_penalty != 1.0:
            prompt = torch.tensor(list(rows[i].prompt_token_ids), dtype=torch.long)
            seen = (torch.bincount(prompt, minlength=vocab_size)[:vocab_size] > 0).to(row.device)
            seen |= counts > 0
            p = params.repetition_penalty
            row.copy_(torch.where(seen, torch.where(row > 0, row / p, row * p), row))
        if params.frequency_penalty:
            row.sub_(params.frequency_penalty * counts.to(row.dtype))
        if params.presence_penalty:
            row.sub_(params.presence_penalty * (counts > 0).to(row.dtype))
    return out
