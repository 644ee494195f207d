"""Cache salts: requests share prefix blocks only within one salt, locally and after an import."""

from __future__ import annotations

import pytest

from core.errors import InvalidRequestError
from core.hashing import hash_prompt_blocks, root_hash
from core.sampling import SamplingParams
from engine.llm import LLM

GREEDY = SamplingParams(max_tokens=2, temperature=0.0)
PROMPT = list(range(3, 3 + 80))  # 5 full blocks of 16


def test_a_salt_changes_the_root_and_every_block_hash() -> None:
    assert root_hash(0, None) == root_hash(0, "") == root_hash(0)
    assert root_hash(0, "a") != root_hash(0) and root_hash(0, "a") != root_hash(0, "b")
    plain = hash_prompt_blocks(PROMPT, 16)
    salted = hash_prompt_blocks(PROMPT, 16, salt="tenant-a")
    assert len(plain) == len(salted) == 5
    assert not set(plain) & set(salted)
    assert salted == hash_prompt_blocks(PROMPT, 16, salt="tenant-a")


def _cached(llm: LLM, salt: str | None) -> int:
    prompt: dict[str, object] = {"prompt_token_ids": PROMPT}
    if salt is not None:
        prompt["cache_salt"] = salt
    (out,) = llm.generate(prompt, GREEDY, use_tqdm=False)
    return out.num_cached_tokens or 0


def test_different_salts_never_share_cached_blocks() -> None:
    llm = LLM("builtin:tiny-llama", max_model_len=256, kv_cache_memory_bytes=4 << 20)
    assert _cached(llm, "a") == 0
    assert _cached(llm, "b") == 0  # same prompt, another tenant: no hit
    assert _cached(llm, None) == 0  # unsalted requests do not see salted blocks either
    assert _cached(llm, "a") == 64  # the same salt hits (the last block is recomputed)
    assert _cached(llm, None) == 64
    with pytest.raises(InvalidRequestError, match="cache_salt must be a non-empty string"):
        llm.generate({"prompt_token_ids": PROMPT, "cache_salt": ""}, GREEDY, use_tqdm=False)


def test_an_import_caches_under_the_prefills_salt() -> None:
    prefill = LLM("builtin:tiny-llama", max_model_len=256, kv_cache_memory_bytes=4 << 20)
    decode = LLM("builtin:tiny-llama", max_model_len=256, kv_cache_memory_bytes=4 << 20)
    engine_a, engine_b = prefill.engine, decode.engine
    engine_a.add_request("p", PROMPT, GREEDY, prefill_only=True, cache_salt="a")
    first = None
    while engine_a.has_unfinished():
        for out in engine_a.step():
            first = out
    pinned = engine_a.get_pinned_blocks("p")
    assert first is not None and pinned is not None
    assert pinned.block_hashes == hash_prompt_blocks(
        PROMPT, 16, seed=engine_a.scheduler.kv.hash_seed, salt="a"
    )
    alloc = engine_b.add_import_request("d", PROMPT, GREEDY, first.token_ids[0], cache_salt="a")
    engine_b.parts.storage.kv[alloc.block_ids] = engine_a.parts.storage.kv[pinned.block_ids]
    assert engine_a.release("p") and engine_b.mark_kv_ready("d")
    while engine_b.has_unfinished():
        engine_b.step()
    assert _cached(decode, "b") == 0
    assert _cached(decode, "a") == 64
