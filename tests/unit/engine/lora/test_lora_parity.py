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


@pytest.mark.parametrize("max_loras", [4, 2])
def test_mixed_batch_equals_each_alone(
    max_loras: int, llama: HFCheckpoint, adapters: Callable[..., MadeAdapter]
) -> None:
    """Four adapters and the base in one generate call; with max_loras=2 the scheduler runs
    at most two adapters at once and device slots are reused."""
    loras: list[LoRARequest | None] = [
        lora(adapters(10 + i, rank=4 * (i + 1)), i + 1) for i in range(4)
    ]
    loras.append(None)
    prompts = prompts_of([7, 21, 12, 30, 9], seed=5)
    llm = LLM(str(llama.path), block_size=8, enable_lora=True, max_loras=max_loras)
    mixed = llm.generate(
        prompt_token_ids=prompts, sampling_params=GREEDY_16, lora_request=loras, use_tqdm=False
    )
    alone = [
        llm.generate(
            prompt_token_ids=[prompt],
            sampling_params=GREEDY_16,
            lora_request=request,
            use_tqdm=False,
        )[0]
        for prompt, request in zip(prompts, loras, strict=True)
    ]
    got = [list(o.outputs[0].token_ids) for o in mixed]
    assert got == [list(o.outputs[0].token_ids) for o in alone]
    assert len({tuple(tokens) for tokens in got}) == len(got)  # every adapter mattered
    llm.engine.scheduler.check_integrity()


def test_chat_takes_a_lora_request(
    llama: HFCheckpoint, adapters: Callable[..., MadeAdapter]
) -> None:
    llm = LLM(str(llama.path), block_size=8, enable_lora=True)
    messages = [{"role": "user", "content": "hi"}]
    request = lora(adapters(1), 1)
    with_adapter = llm.chat(messages, GREEDY_16, lora_request=request, use_tqdm=False)
    base = llm.chat(messages, GREEDY_16, use_tqdm=False)
    prompt = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    ids = llm.tokenizer.encode(prompt, add_special_tokens=False)
    expected = llm.generate(
        prompt_token_ids=[ids], sampling_params=GREEDY_16, lora_request=request, use_tqdm=False
    )
    assert with_adapter[0].outputs[0].token_ids == expected[0].outputs[0].token_ids
    assert with_adapter[0].outputs[0].token_ids != base[0].outputs[0].token_ids
