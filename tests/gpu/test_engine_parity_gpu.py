"""The engine on CUDA against HF transformers on CUDA, for a dense and a MoE built-in.

fp32: token-identical greedy output under batching, prefix-cache hits, chunked prefill and
preemption (dense decode runs through CUDA graphs, the default on CUDA). bf16 (what ``dtype:
auto`` picks on CUDA): HF, teacher-forced on our greedy continuation, picks the same next token
almost everywhere (bf16 rounding may flip a rare near-tie, so not token-identity).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from engine import LLM, SamplingParams
from tests.gpu.helpers import DEVICE, KV_BYTES, fresh_seed, hf_greedy_cuda, random_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

BUILTINS = ["builtin:tiny-llama", "builtin:tiny-moe"]
NEW_TOKENS = 32
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0)
BF16_AGREEMENT = 0.9  # a broken engine agrees ~1/vocab of the time


def tokens(outs) -> list[list[int]]:
    return [list(o.token_ids) for o in outs]


def check_idle(llm: LLM) -> None:
    scheduler = llm.engine.scheduler
    scheduler.check_integrity()
    stats = scheduler.stats()
    assert stats.num_used_blocks == 0 and stats.num_running == stats.num_waiting == 0


@pytest.mark.parametrize("name", BUILTINS)
def test_fp32_greedy_matches_hf_with_prefix_hits_chunks_and_preemption(
    name: str, hf_cuda: Callable[[str, torch.dtype], torch.nn.Module]
) -> None:
    hf = hf_cuda(name, torch.float32)
    seed = fresh_seed()
    vocab = hf.config.vocab_size
    shared = random_prompts([48], vocab, seed)[0]
    tails = random_prompts([5, 11, 2, 19, 7, 13], vocab, seed + 1)
    prompts = [shared + tail for tail in tails] + random_prompts([70, 23], vocab, seed + 2)
    expected = [hf_greedy_cuda(hf, p, NEW_TOKENS) for p in prompts]

    # 32-token steps: prompts are chunked, and decodes share steps with prefill chunks
    llm = LLM(
        name,
        dtype="float32",
        block_size=8,
        max_num_batched_tokens=32,
        kv_cache_memory_bytes=KV_BYTES,
    )
    assert llm.engine.parts.storage.kv.device.type == DEVICE
    first = llm.generate(prompt_token_ids=prompts[:1], sampling_params=GREEDY)
    rest = llm.generate(prompt_token_ids=prompts[1:], sampling_params=GREEDY)
    assert tokens(first + rest) == expected, f"seed={seed}"
    assert all(o.num_cached_tokens >= 48 for o in rest[:5]), "shared prefix not reused"
    check_idle(llm)

    # a 24-block KV budget cannot hold eight requests at once: some are preempted, recomputed
    tight = LLM(
        name,
        dtype="float32",
        block_size=8,
        max_num_batched_tokens=32,
        kv_cache_memory_bytes=24 * llm.engine.parts.layout.block_bytes,
    )
    outs = tight.generate(prompt_token_ids=prompts, sampling_params=GREEDY)
    assert tight.engine.scheduler.stats().num_preemptions_total > 0
    assert tokens(outs) == expected, f"seed={seed}"
    check_idle(tight)


@pytest.mark.parametrize("name", BUILTINS)
def test_bf16_auto_dtype_follows_hf_bf16(
    name: str, hf_cuda: Callable[[str, torch.dtype], torch.nn.Module]
) -> None:
    hf = hf_cuda(name, torch.bfloat16)
    llm = LLM(name, kv_cache_memory_bytes=KV_BYTES)  # dtype auto
    assert llm.engine.parts.storage.kv.dtype == torch.bfloat16
    assert next(llm.engine.parts.model.parameters()).dtype == torch.bfloat16
    seed = fresh_seed()
    prompts = random_prompts([20, 45, 90, 200, 7, 333], hf.config.vocab_size, seed)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    agree = total = 0
    for prompt, out in zip(prompts, outs, strict=True):
        ours = torch.tensor(out.token_ids, device=DEVICE)
        sequence = torch.tensor([prompt + list(out.token_ids)], device=DEVICE)
        with torch.inference_mode():
            logits = hf(sequence).logits[0]  # [len, vocab]
        hf_next = logits[len(prompt) - 1 : -1].argmax(-1)  # HF's pick after each of our prefixes
        agree += int((hf_next == ours).sum())
        total += len(out.token_ids)
    assert agree / total >= BF16_AGREEMENT, f"{agree}/{total} agree (seed={seed})"
