"""KV computed under one adapter is never a prefix hit for another adapter or the base."""

from __future__ import annotations

from collections.abc import Callable

from core.hashing import hash_prompt_blocks, root_hash
from engine import LLM, LoRARequest, SamplingParams
from tests.unit.engine.lora.peft_adapters import MadeAdapter
from tests.unit.engine.models.hf_checkpoints import HFCheckpoint

GREEDY = SamplingParams(max_tokens=2, temperature=0.0)
PROMPT = list(range(3, 3 + 40))  # 5 full blocks of 8


def test_an_adapter_changes_the_root_and_every_block_hash() -> None:
    assert root_hash(0, None, None) == root_hash(0)
    assert root_hash(0, None, "a") not in {root_hash(0), root_hash(0, "a"), root_hash(0, None, "b")}
    assert root_hash(0, "s", "a") != root_hash(0, None, "a")
    base = hash_prompt_blocks(PROMPT, 8)
    adapted = hash_prompt_blocks(PROMPT, 8, lora_name="a")
    assert len(base) == len(adapted) == 5
    assert not set(base) & set(adapted)
    assert not set(adapted) & set(hash_prompt_blocks(PROMPT, 8, lora_name="b"))


def test_prefix_hits_never_cross_adapters(
    llama: HFCheckpoint, adapters: Callable[..., MadeAdapter]
) -> None:
    llm = LLM(str(llama.path), block_size=8, enable_lora=True, max_loras=2)
    first = LoRARequest("first", 1, str(adapters(1).path))
    second = LoRARequest("second", 2, str(adapters(2).path))

    def cached(request: LoRARequest | None) -> int:
        (out,) = llm.generate(
            prompt_token_ids=[PROMPT], sampling_params=GREEDY, lora_request=request, use_tqdm=False
        )
        return out.num_cached_tokens or 0

    assert cached(first) == 0
    assert cached(second) == 0  # same prompt, another adapter: no hit
    assert cached(None) == 0  # the base never sees adapter blocks
    assert cached(first) == 32  # the same adapter hits (the last block is recomputed)
    assert cached(second) == 32
    assert cached(None) == 32
    llm.engine.scheduler.check_integrity()
