"""Shared helpers of the GPU tests: engines with the tests' KV budget, fresh random seeds and
prompts, and HF greedy references on CUDA.

Nothing here touches the device at import time, so collecting ``tests/`` on a CPU machine stays
cheap.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch

from engine import LLM

DEVICE = "cuda"
# NOTE: without an explicit budget an engine takes 90% of the free GPU memory, and the next
# engine built in this process finds none left; every GPU test engine gets this much.
KV_BYTES = 256 << 20


def gpu_llm(model: str, **options: Any) -> LLM:
    """``LLM(model, **options)`` with the GPU tests' KV budget."""
    return LLM(model, kv_cache_memory_bytes=KV_BYTES, **options)


def fresh_seed() -> int:
    """A seed nobody chose: each run draws new inputs (the seed is in every failure message)."""
    return random.SystemRandom().randrange(2**31)


def random_prompts(lengths: Sequence[int], vocab: int, seed: int) -> list[list[int]]:
    """Prompts of random token ids in ``3..vocab-1`` (no special ids), one per length."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def eos_ids(hf_model: torch.nn.Module) -> set[int]:
    """The HF model's EOS ids as a set."""
    eos = hf_model.config.eos_token_id  # type: ignore[union-attr]
    return set(eos if isinstance(eos, list) else [] if eos is None else [eos])


@torch.inference_mode()
def hf_greedy_cuda(hf_model: torch.nn.Module, prompt: Sequence[int], n: int) -> list[int]:
    """HF ``generate()`` greedy continuation on CUDA, cut after the first EOS as ours stops."""
    ids = torch.tensor([list(prompt)], device=DEVICE)
    out = hf_model.generate(  # type: ignore[operator]
        ids, max_new_tokens=n, do_sample=False, pad_token_id=0
    )
    tokens = out[0, len(prompt) :].tolist()
    stops = eos_ids(hf_model)
    cut = next((i + 1 for i, t in enumerate(tokens) if t in stops), len(tokens))
    return tokens[:cut]
