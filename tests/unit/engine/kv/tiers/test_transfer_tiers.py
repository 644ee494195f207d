"""Transfers and tiers together: a prefill whose prefix came back from its host tier exports
exact KV; a decode import takes its prefix from the decode replica's own host or disk tier and
pulls only the rest; a corrupted disk block makes the import recompute (same output); an import
aborted while its prefix loads frees everything."""

from __future__ import annotations

import random
from pathlib import Path

from core.config import DiskTierConfig, HostTierConfig, KVTiersConfig
from core.sampling import SamplingParams
from engine.engine import LLMEngine
from engine.llm import LLM
from engine.scheduler.output import ImportAllocation, PinnedBlocks

MODEL = "builtin:tiny-llama"
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
BLOCK = 16


def _block_bytes() -> int:
    probe = LLM(MODEL, max_model_len=256, kv_cache_memory_bytes=4 << 20)
    return probe.engine.parts.layout.block_bytes


def _tokens(seed: int, count: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 200) for _ in range(count)]


CONVERSATION = _tokens(1, 5 * BLOCK)  # turn 1: 5 full blocks
TURN_2 = CONVERSATION + _tokens(2, 2 * BLOCK + 5)  # turn 2 extends it
OTHERS = [_tokens(10 + i, 5 * BLOCK) for i in range(3)]  # push turn 1 out of the device pool


def _run(llm: LLM, prompt: list[int]) -> list[int]:
    (result,) = llm.generate(prompt_token_ids=[prompt], sampling_params=GREEDY, use_tqdm=False)
    return list(result.outputs[0].token_ids)


def _tiered(tiers: KVTiersConfig) -> LLM:
    return LLM(MODEL, max_model_len=256, kv_cache_memory_bytes=12 * _block_bytes(), kv_tiers=tiers)


def _offload_turn_1(llm: LLM) -> None:
    """Turn 1 runs, then other prompts evict its blocks from the device into the tiers."""
    _run(llm, CONVERSATION)
    for prompt in OTHERS:
        _run(llm, prompt)
    assert llm.engine.scheduler.kv.pool.num_cached_blocks < 12


def _prefill(engine: LLMEngine, request_id: str, prompt: list[int]) -> tuple[PinnedBlocks, int]:
    engine.add_request(request_id, prompt, GREEDY, prefill_only=True)
    first = None
    while engine.has_unfinished():
        for out in engine.step():
            first = out
    pinned = engine.get_pinned_blocks(request_id)
    assert first is not None and pinned is not None
    return pinned, first.token_ids[0]


def _write_missing(
    src: LLMEngine, pinned: PinnedBlocks, dst: LLMEngine, alloc: ImportAllocation
) -> None:
    for index in alloc.missing_block_indices:
        dst.parts.storage.kv[alloc.block_ids[index]] = src.parts.storage.kv[pinned.block_ids[index]]


def _decode(engine: LLMEngine, request_id: str, first_token: int) -> list[int]:
    tokens = [first_token]
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == request_id:
                tokens = list(out.token_ids)
    engine.scheduler.check_integrity()
    return tokens


def test_a_prefill_whose_prefix_came_back_from_host_exports_exact_kv() -> None:
    reference = _run(LLM(MODEL, max_model_len=256, kv_cache_memory_bytes=4 << 20), TURN_2)
    prefill = _tiered(KVTiersConfig(host=HostTierConfig(bytes=64 * _block_bytes())))
    _offload_turn_1(prefill)
    pinned, first = _prefill(prefill.engine, "p", TURN_2)
    host = {s.medium: s for s in prefill.engine.scheduler.tier_stats()}["host"]
    assert host.onload_blocks_total >= 1  # turn 1's prefix was brought back before the export
    decode = LLM(MODEL, max_model_len=256, kv_cache_memory_bytes=4 << 20)
    alloc = decode.engine.add_import_request("d", TURN_2, GREEDY, first)
    assert alloc.num_local_blocks == 0
    _write_missing(prefill.engine, pinned, decode.engine, alloc)
    assert prefill.engine.release("p")
    assert decode.engine.mark_kv_ready("d")
    assert _decode(decode.engine, "d", first) == reference
    prefill.engine.scheduler.check_integrity()
    prefill.engine.close()


def _import_turn_2(decode: LLM, prefill: LLM) -> tuple[list[int], ImportAllocation]:
    pinned, first = _prefill(prefill.engine, "p", TURN_2)
    alloc = decode.engine.add_import_request("d", TURN_2, GREEDY, first)
    _write_missing(prefill.engine, pinned, decode.engine, alloc)
    assert prefill.engine.release("p")
    assert decode.engine.mark_kv_ready("d")
    return _decode(decode.engine, "d", first), alloc


def test_an_import_takes_its_prefix_from_the_decode_host_tier_and_pulls_the_rest() -> None:
    reference = _run(LLM(MODEL, max_model_len=256, kv_cache_memory_bytes=4 << 20), TURN_2)
    decode = _tiered(KVTiersConfig(host=HostTierConfig(bytes=64 * _block_bytes())))
    _offload_turn_1(decode)
    prefill = LLM(MODEL, max_model_len=256, kv_cache_memory_bytes=4 << 20)
    tokens, alloc = _import_turn_2(decode, prefill)
    assert tokens == reference
    assert alloc.num_local_blocks == 5  # turn 1's blocks, from the device or the host tier
    host = {s.medium: s for s in decode.engine.scheduler.tier_stats()}["host"]
    assert host.onload_blocks_total >= 1
    decode.engine.close()


def test_a_corrupted_disk_block_under_an_import_recomputes_the_prompt(tmp_path: Path) -> None:
    reference = _run(LLM(MODEL, max_model_len=256, kv_cache_memory_bytes=4 << 20), TURN_2)
    disk = DiskTierConfig(path=str(tmp_path), bytes=64 * _block_bytes())
    decode = _tiered(KVTiersConfig(disk=disk))
    _offload_turn_1(decode)
    tiers = decode.engine.scheduler.tiers
    assert tiers is not None
    tiers.io.disk(lambda: None).result()  # the disk writes before this one are done
    files = list(tmp_path.rglob("*.kvb"))
    assert files
    for path in files:
        data = bytearray(path.read_bytes())
        data[-5] ^= 0xFF
        path.write_bytes(bytes(data))
    prefill = LLM(MODEL, max_model_len=256, kv_cache_memory_bytes=4 << 20)
    tokens, alloc = _import_turn_2(decode, prefill)
    assert tokens == reference
    assert alloc.num_local_blocks > 0  # promised from disk, then refused: recomputed
    stats = {s.medium: s for s in decode.engine.scheduler.tier_stats()}
    assert stats["disk"].onload_blocks_total < alloc.num_local_blocks
    decode.engine.close()


def test_an_import_aborted_while_its_prefix_loads_frees_its_blocks() -> None:
    decode = _tiered(KVTiersConfig(host=HostTierConfig(bytes=64 * _block_bytes())))
    _offload_turn_1(decode)
    scheduler = decode.engine.scheduler
    free_before = scheduler.kv.num_free_blocks
    prefill = LLM(MODEL, max_model_len=256, kv_cache_memory_bytes=4 << 20)
    _, first = _prefill(prefill.engine, "p", TURN_2)
    decode.engine.add_import_request("d", TURN_2, GREEDY, first)
    assert decode.engine.abort("d")
    scheduler.check_integrity()
    while scheduler.has_unfinished():
        decode.engine.step()
    scheduler.check_integrity()
    assert scheduler.get_request("d") is None
    assert scheduler.kv.num_free_blocks == free_before
    decode.engine.close()
