"""8-bit KV cache: row packing bounds, the layout and its fingerprint, capacity, greedy outputs
against the model-dtype cache, cached runs, bit-exact block transfer and the tiers."""

from __future__ import annotations

import pytest
import torch

from core.config import HostTierConfig, KVTiersConfig
from core.errors import LayoutMismatchError
from core.sampling import SamplingParams
from engine.kv.quantized_rows import pack_rows, unpack_rows
from engine.llm import LLM

GREEDY = SamplingParams(max_tokens=10, temperature=0.0)
PROMPTS = [list(range(5 + i, 70 + i)) for i in range(3)]


def test_int8_rows_round_trip_within_half_a_step() -> None:
    x = torch.randn(7, 2, 32) * torch.tensor([0.01, 50.0])[None, :, None]
    rows = pack_rows(x, torch.int8)
    assert rows.shape == (7, 2, 34) and rows.dtype is torch.int8
    scale = rows[..., -2:].contiguous().view(torch.float16).float()  # [7, 2, 1]
    assert ((unpack_rows(rows, torch.float32) - x).abs() <= scale / 2 + 1e-7).all()


def test_fp8_rows_keep_three_mantissa_bits() -> None:
    x = torch.randn(5, 4, 64)
    back = unpack_rows(pack_rows(x, torch.float8_e4m3fn), torch.float32)
    amax = x.abs().amax(dim=-1, keepdim=True)
    assert ((back - x).abs() <= x.abs() / 16 + amax / 448 * 2**-6 + 1e-6).all()
    zeros = torch.zeros(1, 1, 8)
    assert unpack_rows(pack_rows(zeros, torch.int8), torch.float32).eq(0).all()


def _llm(kv_cache_dtype: str = "auto", **kwargs: object) -> LLM:
    return LLM(
        "builtin:tiny-llama",
        max_model_len=256,
        kv_cache_memory_bytes=4 << 20,
        kv_cache_dtype=kv_cache_dtype,  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )


def _outputs(llm: LLM) -> list[list[int]]:
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_layouts_capacity_and_fingerprints() -> None:
    auto, int8, fp8 = _llm(), _llm("int8"), _llm("fp8_e4m3")
    a, i, f = (x.engine.parts.layout for x in (auto, int8, fp8))
    assert (i.dtype, i.scale_bytes, f.dtype) == ("int8", 2, "float8_e4m3fn")
    assert i.bytes_per_token == 2 * a.num_layers * a.num_kv_heads * (a.head_dim + 2)
    assert a.bytes_per_token / i.bytes_per_token == pytest.approx(4 * 32 / 34)  # fp32 model
    assert len({a.fingerprint(), i.fingerprint(), f.fingerprint()}) == 3
    with pytest.raises(LayoutMismatchError, match="dtype: 'int8' != 'float32'"):
        i.check_compatible(a)
    blocks = [x.engine.scheduler.kv.pool.num_usable_blocks for x in (auto, int8)]
    assert blocks[1] >= 3.7 * blocks[0]


def test_int8_kv_greedy_matches_the_model_dtype_cache_and_its_own_cached_runs() -> None:
    reference = _outputs(_llm())
    int8 = _llm("int8")
    first = _outputs(int8)
    assert first == reference
    assert _outputs(int8) == first  # the second run reads every prompt block back from int8
    fp8 = _llm("fp8_e4m3")
    assert _outputs(fp8) == _outputs(fp8)
    int8.engine.scheduler.check_integrity()


def test_quantized_blocks_transfer_bit_exact_and_tier_round_trip() -> None:
    prefill, decode = _llm("int8"), _llm("int8")
    engine_a, engine_b = prefill.engine, decode.engine
    prompt = PROMPTS[0]
    engine_a.add_request("p", prompt, GREEDY, prefill_only=True)
    first = None
    while engine_a.has_unfinished():
        for out in engine_a.step():
            first = out
    pinned = engine_a.get_pinned_blocks("p")
    assert first is not None and pinned is not None
    alloc = engine_b.add_import_request("d", prompt, GREEDY, first.token_ids[0])
    for index in alloc.missing_block_indices:  # the bytes the transfer layer moves
        src = engine_a.parts.storage.block_view(pinned.block_ids[index])
        dst = engine_b.parts.storage.block_view(alloc.block_ids[index])
        dst[:] = src
    engine_b.mark_kv_ready("d")
    tokens: list[int] = []
    while engine_b.has_unfinished():
        for out in engine_b.step():
            tokens = list(out.token_ids)
    local = prefill.generate(prompt_token_ids=[prompt], sampling_params=GREEDY, use_tqdm=False)
    assert tokens == list(local[0].outputs[0].token_ids)

    block = engine_a.parts.layout.block_bytes
    tiers = KVTiersConfig(host=HostTierConfig(bytes=64 * block))
    small = {"max_model_len": 256, "kv_cache_memory_bytes": 12 * block, "kv_cache_dtype": "int8"}
    tiered = LLM("builtin:tiny-llama", kv_tiers=tiers, **small)  # type: ignore[arg-type]
    plain = LLM("builtin:tiny-llama", **small)  # type: ignore[arg-type]
    assert _outputs(tiered) + _outputs(tiered) == _outputs(plain) + _outputs(plain)
    host = {t.medium: t for t in tiered.engine.scheduler.tier_stats()}["host"]
    assert host.onload_blocks_total > 0  # quantized blocks came back from host
    tiered.engine.close()


def test_the_sizer_counts_what_the_engine_allocates() -> None:
    from sizer.model_dir import load_model_shape

    shape = load_model_shape("builtin:tiny-llama")
    for kv_cache_dtype, sizer_dtype in (("int8", "int8"), ("fp8_e4m3", "fp8")):
        layout = _llm(kv_cache_dtype).engine.parts.layout
        assert shape.kv_bytes_per_token(sizer_dtype) == layout.bytes_per_token
    assert shape.kv_bytes_per_token("fp32") == _llm().engine.parts.layout.bytes_per_token
