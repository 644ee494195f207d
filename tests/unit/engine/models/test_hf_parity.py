"""Our models against HF transformers on the same random weights: logits and greedy tokens."""

from __future__ import annotations

import pytest
import torch

from engine.attention.metadata import AttentionMetadata
from engine.loader import load_model
from tests.unit.engine.models.hf_checkpoints import (
    DENSE_PRESETS,
    MOE_PRESETS,
    assert_greedy_matches,
    greedy_generate,
    hf_greedy,
    new_kv_cache,
    torch_backend,
)

ALL_PRESETS = DENSE_PRESETS + MOE_PRESETS
PROMPTS = [[3, 17, 42, 99, 5], [200, 1, 7, 7, 7, 150, 61, 8, 33, 90, 12, 4, 250, 19], [77]]
NUM_NEW_TOKENS = 32


@pytest.mark.parametrize("preset", ALL_PRESETS)
def test_prefill_logits_match_hf(hf_checkpoint, preset: str) -> None:
    ckpt = hf_checkpoint(preset)
    model = load_model(ckpt.path, dtype=torch.float32, device="cpu", attn_backend=torch_backend())
    lens = [len(p) for p in PROMPTS]
    block_size = 4
    tables, next_block = [], 0
    for n in lens:
        num_blocks = -(-n // block_size)
        tables.append(list(range(next_block, next_block + num_blocks))[::-1])  # reversed ids
        next_block += num_blocks
    meta = AttentionMetadata.build(lens, lens, tables, block_size)
    ids = torch.tensor([t for p in PROMPTS for t in p])
    positions = torch.cat([torch.arange(n) for n in lens])
    with torch.no_grad():
        hidden = model(ids, positions, new_kv_cache(model, next_block, block_size), meta)
        ours = model.compute_logits(hidden)  # [T, V]
        theirs = torch.cat([ckpt.hf_model(torch.tensor([p])).logits[0] for p in PROMPTS])
    assert ours.dtype == torch.float32
    assert ours.shape == (sum(lens), model.config.vocab_size)
    torch.testing.assert_close(ours, theirs.float(), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("preset", ALL_PRESETS)
def test_greedy_tokens_match_hf_generate(hf_checkpoint, preset: str) -> None:
    ckpt = hf_checkpoint(preset)
    model = load_model(ckpt.path, dtype=torch.float32, device="cpu", attn_backend=torch_backend())
    ours, our_logits = greedy_generate(model, PROMPTS, NUM_NEW_TOKENS)
    for prompt, tokens, logits in zip(PROMPTS, ours, our_logits, strict=True):
        theirs, their_logits = hf_greedy(ckpt.hf_model, prompt, NUM_NEW_TOKENS)
        assert len(tokens) == NUM_NEW_TOKENS
        assert_greedy_matches(tokens, logits, theirs, their_logits)


def test_chunked_prefill_over_cached_prefix_matches_one_shot(hf_checkpoint) -> None:
    model = load_model(
        hf_checkpoint("qwen3-moe").path,
        dtype=torch.float32,
        device="cpu",
        attn_backend=torch_backend(),
    )
    prompt = PROMPTS[1]
    block_size, split = 4, 6
    table = [[2, 0, 3, 1]]
    kv_cache = new_kv_cache(model, 4, block_size)
    ids, positions = torch.tensor(prompt), torch.arange(len(prompt))
    with torch.no_grad():
        one_shot = model.compute_logits(
            model(
                ids,
                positions,
                new_kv_cache(model, 4, block_size),
                AttentionMetadata.build([len(prompt)], [len(prompt)], table, block_size),
            )
        )
        model(
            ids[:split],
            positions[:split],
            kv_cache,
            AttentionMetadata.build([split], [split], table, block_size),
        )
        rest = len(prompt) - split
        chunked = model.compute_logits(
            model(
                ids[split:],
                positions[split:],
                kv_cache,
                AttentionMetadata.build([rest], [len(prompt)], table, block_size),
            )
        )
    torch.testing.assert_close(chunked, one_shot[split:], atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("preset", ["llama3", "qwen2-moe"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_smoke(hf_checkpoint, preset: str, dtype: torch.dtype) -> None:
    ckpt = hf_checkpoint(preset)
    model = load_model(ckpt.path, dtype=dtype, device="cpu", attn_backend=torch_backend())
    assert all(p.dtype == dtype for p in model.parameters())
    tokens, logits = greedy_generate(model, PROMPTS[:2], 4)
    with torch.no_grad():
        reference = ckpt.hf_model(torch.tensor([PROMPTS[0]])).logits[0, -1]
    assert all(len(t) == 4 for t in tokens)
    assert torch.isfinite(logits[0]).all()
    # Close-ish: half precision rounds every activation; the logit vectors stay aligned.
    cosine = torch.nn.functional.cosine_similarity(logits[0][0], reference, dim=0)
    assert cosine > 0.99
