"""The tiny-llama engine the AsyncEngine tests and the P/D hand-off tests share: its model and
engine settings, prompts around block boundaries, the greedy parameters and the offline
reference they are checked against, and the checks run on an ``AsyncEngine``'s thread."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

from core.config import EngineConfig, ModelConfig
from core.sampling import SamplingParams
from engine.async_engine import AsyncEngine
from engine.engine import LLMEngine
from engine.engine_builder import build_async_engine
from engine.llm import LLM

MODEL = ModelConfig(name="builtin:tiny-llama")
ENGINE = EngineConfig(max_model_len=512, kv_cache_memory_bytes=16 << 20)
BLOCK_SIZE = ENGINE.block_size
MAX_TOKENS = 12
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)


def random_prompt(length: int, seed: int) -> list[int]:
    """``length`` token ids drawn from ``seed`` (no special ids)."""
    rng = random.Random(seed)
    return [rng.randrange(3, 250) for _ in range(length)]


# Lengths around block boundaries: < 1 block, exactly 1, 2 + 1 token, exactly 4, 4 + partial,
# and ten blocks (several in-process chunks).
PROMPTS: dict[str, list[int]] = {
    f"len{n}": random_prompt(n, seed) for seed, n in enumerate((5, 16, 33, 64, 70, 150))
}


def new_offline_llm() -> LLM:
    """The offline API on its own engine, with the same settings as ``ENGINE``."""
    return LLM(MODEL.name, max_model_len=512, kv_cache_memory_bytes=16 << 20)


def greedy_reference(llm: LLM) -> dict[str, list[int]]:
    """Greedy token ids of every prompt from ``llm`` (the peer), each ``MAX_TOKENS`` long."""
    outputs = llm.generate(prompt_token_ids=list(PROMPTS.values()), sampling_params=GREEDY)
    refs = {name: list(out.token_ids) for name, out in zip(PROMPTS, outputs, strict=True)}
    for name, ids in refs.items():
        assert len(ids) == MAX_TOKENS, f"{name} hits EOS early; pick another seed"
    return refs


async def check_integrity(engine: AsyncEngine) -> None:
    """``scheduler.check_integrity()`` on the engine thread; nothing pinned or importing."""

    def check(llm_engine: LLMEngine) -> None:
        scheduler = llm_engine.scheduler
        scheduler.check_integrity()
        stats = scheduler.stats()
        assert stats.num_pinned == 0 and stats.num_waiting_for_kv == 0, stats

    await engine.call(check)


async def reset_prefix_cache(engine: AsyncEngine) -> None:
    """Forget every cached block on ``engine`` (the next import pulls every block)."""
    await engine.call(lambda e: e.scheduler.reset_prefix_cache())


async def num_pinned_prefix_blocks(engine: AsyncEngine) -> int:
    """Blocks held by prefix pins (exports of cached prefixes, handoffs) on ``engine``."""
    return await engine.call(lambda llm: llm.scheduler.kv.num_pinned_prefix_blocks)


@contextmanager
def two_engines(engine: EngineConfig) -> Iterator[tuple[AsyncEngine, AsyncEngine]]:
    """Two engines of the tiny model with ``engine``'s settings (a holder and a target),
    shut down on the way out."""
    holder = build_async_engine(MODEL, engine)
    target = build_async_engine(MODEL, engine)
    try:
        yield holder, target
    finally:
        holder.shutdown()
        target.shutdown()
