"""The pipelined handoff: the prefill exports a prompt's KV before computing it, the decode pulls
each chunk's blocks as they complete and learns the first token from the export. Greedy output
equals the offline engine (chunked the same way) for every prompt length around chunk and block
boundaries, over both transports, with prefix hits on the decode side and 8-bit KV; a prefill
that fails or is abandoned mid-pipeline leaves nothing allocated on either side."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import aclosing

import pytest

from cluster.ingress.dispatch.migration import can_migrate
from core.config import EngineConfig, TransferConfig
from core.messages import DecodeRequest, PrefillRequest, PrefillResult, PrefillStarted, TokenChunk
from core.sampling import SamplingParams
from decode.build import build_decode_worker
from decode.worker import DecodeWorker
from engine.llm import LLM
from prefill.build import build_prefill_worker
from prefill.worker import PrefillWorker
from tests.unit.decode.helpers import Handoff, collect
from tests.unit.decode.pd_pair import TRANSFER, Pair, assert_quiescent
from tests.unit.engine.async_engine.tiny_engine import MODEL, reset_prefix_cache
from tests.unit.engine.async_engine.tiny_engine import random_prompt as _prompt
from tests.waiting import async_wait_until
from transfer import FaultInjection, InProcKVHub, InProcKVTransport
from transfer.streams import StreamPlan

pytestmark = pytest.mark.timeout(120)

CHUNK_TOKENS = 32  # the prefill computes prompts in chunks of 32 tokens = 2 blocks
MAX_TOKENS = 8
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
# < 1 block, 1 block, exactly one chunk, two chunks + 1, exactly four chunks, many chunks
PROMPTS = {f"len{n}": _prompt(n, 100 + n) for n in (5, 16, 32, 65, 128, 150)}
SPLIT = {"num_streams": 2, "min_stream_bytes": 64 * 1024}  # 2-block segments, two streams


def engine_config(kv_cache_dtype: str = "auto") -> EngineConfig:
    return EngineConfig(
        max_model_len=512,
        kv_cache_memory_bytes=16 << 20,
        max_num_batched_tokens=CHUNK_TOKENS,
        kv_cache_dtype=kv_cache_dtype,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module", params=["auto", "int8"])
def kv_dtype(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def workers(kv_dtype: str) -> Iterator[tuple[PrefillWorker, DecodeWorker]]:
    engine = engine_config(kv_dtype)
    transfer = TRANSFER.model_copy(update=SPLIT)
    prefill = build_prefill_worker(MODEL, engine, transfer)
    decode = build_decode_worker(MODEL, engine, transfer, kv_failure_policy="recompute")
    yield prefill, decode
    asyncio.run(decode.shutdown())
    asyncio.run(prefill.shutdown())


@pytest.fixture(scope="module")
def reference(kv_dtype: str) -> dict[str, list[int]]:
    """Greedy ids of every prompt from the offline engine, chunked like the prefill."""
    llm = LLM(
        MODEL.name,
        max_model_len=512,
        kv_cache_memory_bytes=16 << 20,
        max_num_batched_tokens=CHUNK_TOKENS,
        kv_cache_dtype=kv_dtype,
    )
    outputs = llm.generate(prompt_token_ids=list(PROMPTS.values()), sampling_params=GREEDY)
    return {name: list(out.token_ids) for name, out in zip(PROMPTS, outputs, strict=True)}


@pytest.fixture(params=["inproc", "grpc"])
def pair(
    request: pytest.FixtureRequest, workers: tuple[PrefillWorker, DecodeWorker]
) -> Iterator[Pair]:
    prefill, decode = workers
    if request.param == "grpc":
        made = Pair("grpc", prefill, decode, decode, lambda _: None, lambda _: prefill.transport)
    else:
        hub = InProcKVHub()
        plan = StreamPlan.from_config(TransferConfig(**SPLIT))
        exporter = InProcKVTransport(prefill.engine.engine.parts.storage, hub)
        importer = InProcKVTransport(decode.engine.engine.parts.storage, hub, plan=plan)
        made = Pair(
            "inproc",
            PrefillWorker(prefill.engine, exporter),
            DecodeWorker(decode.engine, importer),
            DecodeWorker(decode.engine, importer, kv_failure_policy="fail"),
            exporter.set_faults,
            lambda _: exporter,
            hub,
        )
        made.closables += [exporter, importer]
    try:
        yield made
        assert_quiescent(made)
    finally:
        for transport in made.closables:
            transport.close()


async def pipelined(
    pair: Pair, request_id: str, prompt: list[int], params: SamplingParams = GREEDY
) -> Handoff:
    """The pipelined handoff as the ingress runs it: decode starts on the first update."""
    updates = pair.prefill.prefill_stream(PrefillRequest(request_id, prompt, params))
    async with aclosing(updates):
        started = await anext(updates)
        assert isinstance(started, PrefillStarted) and started.kv_handle.pipelined
        request = DecodeRequest(request_id, prompt, params, kv_handle=started.kv_handle)
        decoding = asyncio.create_task(collect(pair.decode, request))
        result = await anext(updates)
        assert isinstance(result, PrefillResult)
    return Handoff(result, await decoding)


@pytest.mark.parametrize("name", list(PROMPTS))
def test_pipelined_output_equals_the_offline_engine(
    pair: Pair, reference: dict[str, list[int]], name: str
) -> None:
    async def run() -> Handoff:
        await reset_prefix_cache(pair.decode.engine)
        return await pipelined(pair, f"pipe-{pair.kind}-{name}", PROMPTS[name])

    handoff = asyncio.run(run())
    assert handoff.prefill.kv_handle is not None and handoff.prefill.kv_handle.pipelined
    assert handoff.token_ids == reference[name]
    assert handoff.chunks[-1].finished and handoff.chunks[-1].error is None


def test_the_decode_pulls_only_the_blocks_it_lacks(pair: Pair) -> None:
    prompt = PROMPTS["len150"]
    longer = [*prompt, *_prompt(40, 7)]

    async def run() -> tuple[int, int]:
        await reset_prefix_cache(pair.decode.engine)
        before = pair.decode.stats().transfer.bytes_total
        await pipelined(pair, f"pipe-{pair.kind}-first", prompt)
        after_first = pair.decode.stats().transfer.bytes_total
        await pipelined(pair, f"pipe-{pair.kind}-second", longer)
        return after_first - before, pair.decode.stats().transfer.bytes_total - after_first

    first_bytes, second_bytes = asyncio.run(run())
    block_bytes = pair.block_bytes
    assert first_bytes == -(-len(prompt) // 16) * block_bytes
    # the first prompt's 9 full blocks are a local hit: only the rest moves
    assert second_bytes == (-(-len(longer) // 16) - len(prompt) // 16) * block_bytes


def test_a_first_token_that_ends_the_request_frees_both_sides(pair: Pair) -> None:
    params = SamplingParams(max_tokens=1, temperature=0.0)
    handoff = asyncio.run(pipelined(pair, f"pipe-{pair.kind}-one", PROMPTS["len65"], params))
    assert handoff.prefill.finish_reason == "length"
    assert handoff.prefill.kv_handle is None  # nothing to decode
    # the decode learnt it from the export and ended without a token of its own
    assert [t for c in handoff.chunks for t in c.token_ids] == []


def test_a_prefill_abandoned_mid_pipeline_fails_the_decode_and_frees_everything(
    pair: Pair,
) -> None:
    prompt = PROMPTS["len150"]

    async def run() -> list[TokenChunk]:
        await reset_prefix_cache(pair.decode.engine)
        request_id = f"pipe-{pair.kind}-gone"
        updates = pair.prefill.prefill_stream(PrefillRequest(request_id, prompt, GREEDY))
        started = await anext(updates)
        assert isinstance(started, PrefillStarted)
        request = DecodeRequest(request_id, prompt, GREEDY, kv_handle=started.kv_handle)
        decoding = asyncio.create_task(collect(pair.decode, request))
        await updates.aclose()  # the ingress went away mid-prefill: the prefill is aborted
        return await decoding

    chunks = asyncio.run(run())
    last = chunks[-1]
    assert last.finished and last.error is not None
    assert can_migrate(last.error.to_error())  # the ingress continues it on a decode replica


@pytest.mark.parametrize("pair", ["inproc"], indirect=True)
def test_a_stream_failing_mid_pipeline_fails_the_request_for_migration(pair: Pair) -> None:
    # every stream fails: the first one while the prefill is still computing later chunks
    pair.set_faults(FaultInjection(fail_after_chunks=0))
    try:
        handoff = asyncio.run(pipelined(pair, "pipe-stream-fails", PROMPTS["len150"]))
    finally:
        pair.set_faults(FaultInjection())
    assert handoff.prefill.first_token_id is not None  # the prefill itself finished
    last = handoff.chunks[-1]
    assert last.finished and last.error is not None
    assert can_migrate(last.error.to_error())


@pytest.mark.parametrize("pair", ["inproc"], indirect=True)
def test_a_lease_expiring_mid_pipeline_ends_the_prefill_cleanly(pair: Pair) -> None:
    # nobody pulls (the decode never came): the export's lease runs out between chunks
    assert pair.hub is not None
    exporter = InProcKVTransport(pair.prefill.engine.engine.parts.storage, pair.hub, lease_s=0.01)
    pair.closables.append(exporter)
    prefill = PrefillWorker(pair.prefill.engine, exporter)

    async def run() -> list[PrefillStarted | PrefillResult]:
        request = PrefillRequest("pipe-lease", PROMPTS["len150"], GREEDY)
        updates: list[PrefillStarted | PrefillResult] = []
        async for update in prefill.prefill_stream(request):
            updates.append(update)
            await asyncio.sleep(0.05)  # more than the lease: it expires before the next chunk
        return updates

    updates = asyncio.run(run())
    assert isinstance(updates[0], PrefillStarted)
    assert isinstance(updates[-1], PrefillResult) and updates[-1].first_token_id is not None
    assert exporter.exporter.num_live_exports() == 0


@pytest.mark.parametrize("pair", ["inproc", "grpc"], indirect=True)
def test_the_decode_aborting_mid_pipeline_frees_both_sides(pair: Pair) -> None:
    async def run() -> tuple[PrefillResult, list[TokenChunk]]:
        await reset_prefix_cache(pair.decode.engine)
        request_id, prompt = f"pipe-{pair.kind}-abort", PROMPTS["len150"]
        updates = pair.prefill.prefill_stream(PrefillRequest(request_id, prompt, GREEDY))
        async with aclosing(updates):
            started = await anext(updates)
            assert isinstance(started, PrefillStarted)
            request = DecodeRequest(request_id, prompt, GREEDY, kv_handle=started.kv_handle)
            decoding = asyncio.create_task(collect(pair.decode, request))
            importing = lambda: pair.decode.stats().imports_in_progress == 1  # noqa: E731
            assert await async_wait_until(importing, 30, "the decode importing")
            assert await pair.decode.abort(request_id)
            result = await anext(updates)
            assert isinstance(result, PrefillResult)
        return result, await decoding

    _, chunks = asyncio.run(run())
    assert chunks and chunks[-1].finished
    assert chunks[-1].finish_reason in ("abort", "error") or chunks[-1].error is not None
