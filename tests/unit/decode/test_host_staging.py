"""KV kept off the host (as on a GPU) moves through the storage's host mirror: the prefill role
stages exported blocks to the host, the decode role stages pulled blocks back, and the output is
identical to a local run. Here both storages force the mirror on CPU, so the path is exercised
without CUDA; the mirror starts empty, so a missing stage shows up as wrong tokens."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

import pytest

from core.config import EngineConfig
from decode.worker import DecodeWorker
from engine.async_engine import AsyncEngine
from engine.engine import LLMEngine
from engine.kv.storage import KVStorage
from engine.llm import LLM
from engine.setup import build_engine_parts
from prefill.worker import PrefillWorker
from tests.unit.decode.helpers import handoff
from tests.unit.engine.async_engine.tiny_engine import GREEDY, MODEL, PROMPTS
from transfer import InProcKVHub, InProcKVTransport

ENGINE = EngineConfig(max_model_len=512, kv_cache_memory_bytes=4 << 20)


def staged_engine() -> AsyncEngine:
    parts = build_engine_parts(MODEL, ENGINE)
    storage = KVStorage(
        parts.layout, parts.storage.num_blocks, parts.storage.device, host_staging=True
    )
    assert storage.staged
    parts = dataclasses.replace(parts, storage=storage)
    return AsyncEngine(LLMEngine(parts))


@pytest.fixture(scope="module")
def staged_pair() -> Iterator[tuple[PrefillWorker, DecodeWorker]]:
    hub = InProcKVHub()
    prefill_engine, decode_engine = staged_engine(), staged_engine()
    exporter = InProcKVTransport(prefill_engine.engine.parts.storage, hub)
    importer = InProcKVTransport(decode_engine.engine.parts.storage, hub)
    prefill = PrefillWorker(prefill_engine, exporter)
    decode = DecodeWorker(decode_engine, importer)
    yield prefill, decode
    asyncio.run(prefill.shutdown())
    asyncio.run(decode.shutdown())


def test_staged_handoff_matches_local_run(
    staged_pair: tuple[PrefillWorker, DecodeWorker], offline_llm: LLM
) -> None:
    prefill, decode = staged_pair
    for name in ("len33", "len70"):
        prompt = PROMPTS[name]
        expected = offline_llm.generate(prompt_token_ids=[prompt], sampling_params=GREEDY)[0]
        done = asyncio.run(handoff(prefill, decode, f"staged-{name}", prompt, GREEDY))
        assert done.prefill.kv_handle is not None
        assert done.token_ids == list(expected.token_ids)
