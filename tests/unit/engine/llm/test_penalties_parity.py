"""Greedy decoding with a repetition penalty is token-identical to HF transformers'
``generate(repetition_penalty=...)`` (the CTRL rule over prompt and output tokens)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine import LLM, SamplingParams
from tests.unit.engine.models.hf_checkpoints import HFCheckpoint


def test_repetition_penalty_greedy_matches_hf(
    checkpoint: Callable[[str], HFCheckpoint],
) -> None:
    ckpt = checkpoint("llama")
    llm = LLM(str(ckpt.path), block_size=8)
    prompt = [3, 17, 40, 9, 3, 17, 22, 8]
    params = SamplingParams(temperature=0.0, max_tokens=24, repetition_penalty=1.5,
                            min_tokens=24)  # fmt: skip
    ours = llm.generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)
    hf = ckpt.hf_model.generate(
        torch.tensor([prompt]), max_new_tokens=24, do_sample=False, repetition_penalty=1.5,
        min_new_tokens=24,
    )  # fmt: skip
    assert list(ours[0].outputs[0].token_ids) == hf[0, len(prompt) :].tolist()
