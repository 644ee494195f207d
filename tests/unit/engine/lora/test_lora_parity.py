"""Greedy fp32 under a LoRA adapter equals transformers + peft on the same base and adapter;
a batch mixing four adapters and the base equals each prompt run alone."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from engine import LLM, LoRARequest, SamplingParams
from tests.unit.engine.lora.peft_adapters import MadeAdapter
from tests.unit.engine.models.hf_checkpoints import HFCheckpoint, hf_greedy

GREEDY_16 = SamplingParams(max_tokens=16, temperature=0.0)


def prompts_of(lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 256) for _ in range(n)] for n in lengths]


def lora(made: MadeAdapter, int_id: int) -> LoRARequest:
    return LoRARequest(f"adapter-{int_id}", int_id, str(made.path))


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"rank": 4, "alpha": 8, "targets": ("q_proj", "v_proj")},
        {"rank": 16, "alpha": 8, "use_rslora": True, "targets": ("k_proj", "o_proj", "down_proj")},
        {"rank": 8, "targets": ("gate_proj", "up_proj")},
    ],
)
def test_adapter_matches_peft(
    options: dict[str, object],
    llama: HFCheckpoint,
    adapters: Callable[..., MadeAdapter],
) -> None:
    made = adapters(1, **options)
    llm = LLM(str(llama.path), block_size=8, enable_lora=True, max_lora_rank=16)
    prompts = prompts_of([5, 19, 33], seed=3)
    outs = llm.generate(
        prompt_token_ids=prompts, sampling_params=GREEDY_16, lora_request=lora(made, 1)
    )
    theirs = [hf_greedy(made.peft_model, p, 16)[0] for p in prompts]
    assert [list(o.outputs[0].token_ids) for o in outs] == theirs
    base = [hf_greedy(llama.hf_model, p, 16)[0] for p in prompts]
    assert theirs != base  # the adapter changes the output: this test could fail
