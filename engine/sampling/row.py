"""``SamplingRow``: what the sampler and the penalties read about one row of a logits batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from core.sampling import SamplingParams
from engine.sampling.grammar import GrammarState


@dataclass(frozen=True, slots=True)
class SamplingRow:
    """One logits row's sampling state for this step.

    ``num_generated_tokens`` counts the request's output tokens before this step (for
    ``min_tokens``); ``eos_token_ids`` are the model's end ids; ``generator`` is the request's
    own generator (:func:`~engine.sampling.sampler.make_generator`) or None to use the
    sampler's shared one. The request's prompt and output ids are given when its penalties need
    them.
    """

    params: SamplingParams
    num_generated_tokens: int = 0
    eos_token_ids: tuple[int, ...] = ()
    generator: torch.Generator | None = None
    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()
    grammar: GrammarState | None = None
    """The request's structured-output matcher (``engine.sampling.grammar``), if constrained."""
