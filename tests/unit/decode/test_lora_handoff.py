"""A request naming a LoRA adapter is prefilled and decoded under it: the real builders load
``model.lora_modules`` at start, the prefill and the decode resolve the adapter the request
names, and the P/D output equals the offline engine's under the same adapter (greedy, fp32).
An adapter neither side knows is the OpenAI 404."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterator

import pytest

from core.config import EngineConfig, ModelConfig
from core.config.lora import LoRAModuleConfig
from core.errors import ModelNotFoundError
from core.hashing import hash_prompt_blocks
from core.messages import DecodeRequest, PrefillRequest, RoutingKeys
from core.sampling import SamplingParams
from decode.build import build_decode_worker
from decode.worker import DecodeWorker
from engine import LLM, LoRARequest
from prefill.build import build_prefill_worker
from prefill.worker import PrefillWorker
from tests.unit.decode.pd_pair import TRANSFER
from tests.unit.engine.lora.conftest import adapters, llama  # noqa: F401  (fixtures)
from tests.unit.engine.lora.peft_adapters import MadeAdapter
from tests.unit.engine.models.hf_checkpoints import HFCheckpoint

pytestmark = pytest.mark.timeout(120)

GREEDY = SamplingParams(max_tokens=6, temperature=0.0)
PROMPT = list(range(5, 5 + 21))  # two full blocks of 8 and a tail
ENGINE = EngineConfig(
    max_model_len=256,
    kv_cache_memory_bytes=4 << 20,
    block_size=8,
    enable_lora=True,
    max_loras=2,
)


@pytest.fixture(scope="module")
def workers(
    llama: HFCheckpoint,  # noqa: F811
    adapters: Callable[..., MadeAdapter],  # noqa: F811
) -> Iterator[tuple[PrefillWorker, DecodeWorker]]:
    modules = (
        LoRAModuleConfig(name="sql", path=str(adapters(1).path)),
        LoRAModuleConfig(name="chat", path=str(adapters(2).path)),
    )
    model = ModelConfig(name=str(llama.path), lora_modules=modules)
    prefill = build_prefill_worker(model, ENGINE, TRANSFER)
    decode = build_decode_worker(model, ENGINE, TRANSFER, kv_failure_policy="fail")
    yield prefill, decode
    asyncio.run(decode.shutdown())
    asyncio.run(prefill.shutdown())


def routing(lora_name: str | None) -> RoutingKeys:
    hashes = hash_prompt_blocks(PROMPT, 8, lora_name=lora_name)
    return RoutingKeys(tuple(hashes), len(PROMPT), lora_name=lora_name)


async def run_pd(
    workers: tuple[PrefillWorker, DecodeWorker], rid: str, lora: str | None
) -> list[int]:
    prefill, decode = workers
    result = await prefill.prefill(PrefillRequest(rid, PROMPT, GREEDY, routing(lora)))
    request = DecodeRequest(
        rid,
        PROMPT,
        GREEDY,
        routing(lora),
        first_token_id=result.first_token_id,
        kv_handle=result.kv_handle,
        prompt_chunk_ends=result.prompt_chunk_ends,
    )
    chunks = [chunk async for chunk in decode.generate(request)]
    assert all(chunk.error is None for chunk in chunks), chunks
    return [result.first_token_id] + [t for c in chunks for t in c.token_ids]


def test_both_pools_load_the_yaml_adapters_at_start(
    workers: tuple[PrefillWorker, DecodeWorker],
) -> None:
    for worker in workers:
        assert worker.adapters.names() == ("sql", "chat")
        manager = worker.engine.engine.parts.lora
        assert manager is not None and set(manager.residencies()) == {"sql", "chat"}


def test_pd_under_an_adapter_equals_the_offline_engine(
    workers: tuple[PrefillWorker, DecodeWorker],
    llama: HFCheckpoint,  # noqa: F811
    adapters: Callable[..., MadeAdapter],  # noqa: F811
) -> None:
    llm = LLM(str(llama.path), block_size=8, enable_lora=True, max_loras=2, max_model_len=256)
    expected = {}
    for name, seed in (("sql", 1), ("chat", 2), (None, 0)):
        lora = None if name is None else LoRARequest(name, seed, str(adapters(seed).path))
        (out,) = llm.generate(
            prompt_token_ids=[PROMPT], sampling_params=GREEDY, lora_request=lora, use_tqdm=False
        )
        expected[name] = list(out.token_ids)
    assert len({tuple(ids) for ids in expected.values()}) == 3  # the adapters change the output
    for name in ("sql", "chat", None, "sql"):  # the second "sql" hits its own prefix blocks
        assert asyncio.run(run_pd(workers, f"r-{name}", name)) == expected[name]


def test_an_unknown_adapter_is_a_404_on_either_role(
    workers: tuple[PrefillWorker, DecodeWorker],
) -> None:
    prefill, decode = workers
    with pytest.raises(ModelNotFoundError, match="'nope' is not loaded"):
        asyncio.run(prefill.prefill(PrefillRequest("u1", PROMPT, GREEDY, routing("nope"))))
    local = DecodeRequest("u2", PROMPT, GREEDY, routing("nope"))

    async def chunks() -> list[object]:
        return [chunk async for chunk in decode.generate(local)]

    (last,) = asyncio.run(chunks())
    assert dataclasses.asdict(last)["error"]["status_code"] == 404
