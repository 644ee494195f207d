"""The paged engine behind ``LLM`` is token-identical to HF transformers under batching,
prefix caching, chunked prefill and preemption (greedy, fp32), eager and compiled."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from engine import LLM, SamplingParams
from tests.unit.engine.models.hf_checkpoints import HFCheckpoint, hf_greedy

GREEDY_32 = SamplingParams(max_tokens=32, temperature=0.0)


def prompts_of(lengths: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(n)] for n in lengths]


def hf_reference(ckpt: HFCheckpoint, prompts: list[list[int]], n: int) -> list[list[int]]:
    """HF greedy continuations, cut after the first EOS as our engine stops there."""
    eos = ckpt.hf_model.config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    refs = []
    for prompt in prompts:
        tokens, _ = hf_greedy(ckpt.hf_model, prompt, n)
        cut = next((i + 1 for i, t in enumerate(tokens) if t in eos_ids), len(tokens))
        refs.append(tokens[:cut])
    return refs


def check_integrity_whole(llm: LLM) -> None:
    scheduler = llm.engine.scheduler
    scheduler.check_integrity()
    stats = scheduler.stats()
    assert stats.num_used_blocks == 0
    assert stats.num_running == stats.num_waiting == stats.num_pinned == 0


@pytest.mark.parametrize(
    ("preset", "compiled"),
    [
        ("llama", False),
        ("qwen2", False),
        ("mixtral", False),
        ("qwen2-moe", False),
        ("qwen2-moe", True),  # MoE routing inside the compiled graph
    ],
)
def test_mixed_batch_matches_hf(
    preset: str, compiled: bool, checkpoint: Callable[[str], HFCheckpoint]
) -> None:
    ckpt = checkpoint(preset)
    llm = LLM(str(ckpt.path), block_size=8, compile_model=compiled)
    assert (llm.engine.runner.compiled is not None) is compiled
    prompts = prompts_of([3, 17, 40, 9], llm.tokenizer.vocab_size or 100, seed=1)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY_32)
    assert [list(o.token_ids) for o in outs] == hf_reference(ckpt, prompts, 32)
    check_integrity_whole(llm)


@pytest.mark.parametrize("compiled", [False, True])
def test_prefix_hits_chunked_prefill_and_preemption_keep_outputs(
    compiled: bool, checkpoint: Callable[[str], HFCheckpoint]
) -> None:
    ckpt = checkpoint("llama")
    shared = prompts_of([48], 200, seed=2)[0]
    tails = prompts_of([5, 11, 2, 19, 7, 13], 200, seed=3)
    prompts = [shared + tail for tail in tails] + prompts_of([70], 200, seed=4)
    expected = hf_reference(ckpt, prompts, 32)

    # Prefix cache: the second wave reuses the shared prefix's blocks.
    llm = LLM(str(ckpt.path), block_size=8, max_num_batched_tokens=32, compile_model=compiled)
    first = llm.generate(prompt_token_ids=prompts[:1], sampling_params=GREEDY_32)
    rest = llm.generate(prompt_token_ids=prompts[1:], sampling_params=GREEDY_32)
    outs = first + rest
    assert [list(o.token_ids) for o in outs] == expected
    assert first[0].num_cached_tokens == 0
    assert all(o.num_cached_tokens >= 48 for o in rest[:-1])
    check_integrity_whole(llm)

    # A KV budget of 24 blocks forces preemption with seven requests in flight.
    layout_bytes = llm.engine.parts.layout.block_bytes
    tight = LLM(
        str(ckpt.path),
        block_size=8,
        max_num_batched_tokens=32,
        kv_cache_memory_bytes=24 * layout_bytes,
        compile_model=compiled,
    )
    outs = tight.generate(prompt_token_ids=prompts, sampling_params=GREEDY_32)
    assert tight.engine.scheduler.stats().num_preemptions_total > 0
    assert [list(o.token_ids) for o in outs] == expected
    check_integrity_whole(tight)


def test_sliding_window_matches_hf_past_the_window_with_chunks_and_prefix_hits(
    checkpoint: Callable[[str], HFCheckpoint],
) -> None:
    ckpt = checkpoint("mistral-swa")  # window 24, prompts up to 90 tokens
    llm = LLM(str(ckpt.path), block_size=8, max_num_batched_tokens=32)
    assert llm.engine.max_model_len == 512  # not capped at the window any more
    prompts = prompts_of([60, 90, 23, 41], llm.tokenizer.vocab_size or 100, seed=3)
    expected = hf_reference(ckpt, prompts, 32)
    first = llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY_32)
    assert [list(o.token_ids) for o in first] == expected
    again = llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY_32)  # prefix hits
    assert [list(o.token_ids) for o in again] == expected
    assert all((o.num_cached_tokens or 0) > 0 for o in again[:2])
    check_integrity_whole(llm)


def test_sliding_window_decode_frees_blocks_left_behind(
    checkpoint: Callable[[str], HFCheckpoint],
) -> None:
    ckpt = checkpoint("mistral-swa")  # window 24 on every layer, blocks of 8
    llm = LLM(str(ckpt.path), block_size=8)
    engine, scheduler = llm.engine, llm.engine.scheduler
    prompt = prompts_of([30], llm.tokenizer.vocab_size or 100, seed=5)[0]
    params = SamplingParams(max_tokens=120, temperature=0.0, ignore_eos=True)
    engine.add_request("long", prompt, params)
    held: list[int] = []
    tokens: list[int] = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens = list(out.token_ids)
        held.append(scheduler.stats().num_used_blocks)
        scheduler.check_integrity()
    # 150 tokens would need 19 blocks; the window keeps at most 24 / 8 + 2 of them held
    assert max(held[len(held) // 2 :]) <= 24 // 8 + 2
    assert tokens == hf_reference(ckpt, [prompt], 120)[0]
    check_integrity_whole(llm)
