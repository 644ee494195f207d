"""The torch paged-attention backend against a naive dense computation."""

from __future__ import annotations

import pytest
import torch

from engine.attention import AttentionMetadata, TorchAttentionBackend, get_backend
from engine.attention.torch_backend import attend_fresh_prompts, is_fresh_prompts, write_kv_cache

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}
HEADS = [(4, 4), (8, 2), (16, 2), (8, 1)]  # GQA ratios 1, 4, 8 and MQA


def run(case, backend=None) -> torch.Tensor:
    backend = backend or TorchAttentionBackend()
    return backend.forward(case.q, case.k, case.v, case.layer_cache, case.meta, case.scale)


def check(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


def test_registered_under_its_name() -> None:
    assert isinstance(get_backend("torch"), TorchAttentionBackend)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
def test_decode_batch_ragged(paged_case, reference, dtype, num_heads, num_kv_heads) -> None:
    seq_lens = [1, 17, 40, 33, 16]  # full and partial last blocks
    case = paged_case(
        [1] * len(seq_lens), seq_lens, num_heads=num_heads, num_kv_heads=num_kv_heads, dtype=dtype
    )
    check(run(case), reference(case), dtype)


@pytest.mark.parametrize("block_size", [1, 8, 16, 32])
def test_decode_block_sizes(paged_case, reference, block_size) -> None:
    case = paged_case([1, 1, 1], [5, 64, 37], block_size=block_size)
    check(run(case), reference(case), torch.float32)


def test_decode_single_sequence_uses_no_padding(paged_case, reference) -> None:
    case = paged_case([1], [77], head_dim=64)
    check(run(case), reference(case), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
def test_prefill_without_prefix(paged_case, reference, dtype, num_heads, num_kv_heads) -> None:
    lens = [7, 16, 30]
    case = paged_case(lens, lens, num_heads=num_heads, num_kv_heads=num_kv_heads, dtype=dtype)
    check(run(case), reference(case), dtype)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
def test_prefill_over_cached_prefix_and_chunks(
    paged_case, reference, num_heads, num_kv_heads
) -> None:
    # prefix hit (16 cached + 9 new), a middle chunk (20 of 50), a fresh prompt and a decode
    case = paged_case(
        [9, 20, 12, 1],
        [25, 50, 12, 30],
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        block_size=8,
    )
    check(run(case), reference(case), torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_prefill_over_prefix_low_precision(paged_case, reference, dtype) -> None:
    case = paged_case([5, 16], [21, 48], head_dim=64, dtype=dtype)
    check(run(case), reference(case), dtype)


def test_cache_write_lands_in_slots_and_nowhere_else(paged_case) -> None:
    case = paged_case([3, 1, 6], [3, 20, 14], block_size=4)
    before = case.kv.clone()
    run(case)
    touched = torch.zeros(case.kv.shape[:4], dtype=torch.bool)  # [NB, L, 2, bs]
    block_size = case.meta.block_size
    for token, slot in enumerate(case.meta.slot_mapping.tolist()):
        block, offset = divmod(slot, block_size)
        torch.testing.assert_close(case.kv[block, 1, 0, offset], case.k[token], rtol=0, atol=0)
        torch.testing.assert_close(case.kv[block, 1, 1, offset], case.v[token], rtol=0, atol=0)
        touched[block, 1, :, offset] = True
    assert touched.sum() == 2 * case.meta.num_tokens
    assert torch.equal(case.kv[~touched], before[~touched])


def test_result_independent_of_batch_companions(paged_case) -> None:
    together = paged_case([1, 1], [40, 9])
    alone = paged_case([1, 1], [40, 9])
    alone_meta = AttentionMetadata.build([1], [40], [alone.meta.block_tables[0].tolist()[:3]], 16)
    first_alone = TorchAttentionBackend().forward(
        alone.q[:1], alone.k[:1], alone.v[:1], alone.layer_cache, alone_meta, alone.scale
    )
    torch.testing.assert_close(run(together)[:1], first_alone, atol=1e-6, rtol=1e-6)


def test_empty_batch_returns_empty(paged_case) -> None:
    case = paged_case([1], [4])
    empty = AttentionMetadata.build([], [], [], 16)
    q = case.q[:0]
    out = TorchAttentionBackend().forward(q, case.k[:0], case.v[:0], case.layer_cache, empty, 1.0)
    assert out.shape == (0, 8, 32)


def test_one_instance_serves_successive_steps(paged_case, reference) -> None:
    # The backend caches per-step index tensors; a new step's metadata must replace them.
    backend = TorchAttentionBackend()
    for query_lens, seq_lens in (([1, 1], [9, 40]), ([1, 1, 1], [33, 2, 17]), ([4, 1], [4, 8])):
        case = paged_case(query_lens, seq_lens, block_size=8)
        for _ in range(2):  # two "layers" of the same step
            check(run(case, backend), reference(case), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
def test_fresh_prompts_read_back_from_the_cache(
    paged_case, reference, dtype, num_heads, num_kv_heads
) -> None:
    # the path the Triton backend takes for a step of whole fresh prompts
    lens = [7, 16, 30]
    case = paged_case(lens, lens, num_heads=num_heads, num_kv_heads=num_kv_heads, dtype=dtype)
    assert is_fresh_prompts(case.meta, None)
    assert not is_fresh_prompts(case.meta, 20)  # a window shorter than a prompt: masked path
    write_kv_cache(case.layer_cache, case.k, case.v, case.meta.slot_mapping, 16)
    out = attend_fresh_prompts(case.q, case.layer_cache, case.meta, case.scale)
    check(out, reference(case), dtype)
    assert torch.equal(out, run(case))  # the same SDPA the torch backend runs on new K/V


def test_a_prompt_over_a_cached_prefix_is_not_fresh(paged_case) -> None:
    assert not is_fresh_prompts(paged_case([7, 5], [7, 20]).meta, None)
    assert not is_fresh_prompts(paged_case([1, 1], [9, 20]).meta, None)  # decode
