"""The unhappy paths of the handoff: injected transfer faults under both failure policies, a
layout mismatch, clients that disconnect mid-pull and mid-stream, aborts, and exports that are
never pulled. Every test ends with both engines quiescent (checked by the ``pair`` fixture)."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Sequence

import pytest

from core.ids import new_request_id
from core.kv_handle import KVHandle
from core.messages import TokenChunk
from core.sampling import SamplingParams
from prefill.worker import PrefillWorker
from tests.unit.decode.helpers import collect, decode_request, handoff, prefill
from tests.unit.decode.pd_pair import Pair
from tests.unit.engine.async_engine.tiny_engine import GREEDY, PROMPTS, reset_prefix_cache
from tests.waiting import async_wait_until
from transfer import FaultInjection, KVTransport
from transfer.leases import OnRelease

pytestmark = pytest.mark.timeout(60)

FAULTS = {
    "corrupt_chunk": FaultInjection(corrupt_chunk_seq=0),
    "fail_before_first_chunk": FaultInjection(fail_after_chunks=0),
}
# Only the in-process pair uses chunks smaller than the 5 blocks of "len70" (gRPC chunks are
# >= 1 MiB), so a stream that breaks after a chunk or two is an in-process case.
INPROC_FAULTS = {
    **FAULTS,
    "fail_after_1_chunk": FaultInjection(fail_after_chunks=1),
    "corrupt_third_chunk": FaultInjection(corrupt_chunk_seq=2),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_failed_transfer_recomputes_identically(
    pair: Pair, reference: dict[str, list[int]], fault: str
) -> None:
    _check_recompute(pair, reference, FAULTS[fault])


@pytest.mark.parametrize("pair", ["inproc"], indirect=True)
@pytest.mark.parametrize("fault", list(INPROC_FAULTS))
def test_transfer_that_fails_mid_stream_recomputes_identically(
    pair: Pair, reference: dict[str, list[int]], fault: str
) -> None:
    _check_recompute(pair, reference, INPROC_FAULTS[fault])


def _check_recompute(pair: Pair, reference: dict[str, list[int]], fault: FaultInjection) -> None:
    asyncio.run(reset_prefix_cache(pair.decode.engine))  # pull every block
    pair.set_faults(fault)
    failures_before = pair.decode.stats().transfer.failures_total
    got = asyncio.run(
        handoff(pair.prefill, pair.decode, new_request_id(), PROMPTS["len70"], GREEDY)
    )
    assert got.token_ids == reference["len70"]
    assert all(c.error is None for c in got.chunks)
    assert pair.decode.stats().transfer.failures_total == failures_before + 1
    # The prefill's chunk ends travel with its result, so the recompute chunked the same way.
    assert got.prefill.prompt_chunk_ends[-1] == len(PROMPTS["len70"])


@pytest.mark.parametrize("fault", list(FAULTS))
def test_failed_transfer_with_policy_fail_ends_with_an_error_chunk(pair: Pair, fault: str) -> None:
    _check_fail(pair, FAULTS[fault])


@pytest.mark.parametrize("pair", ["inproc"], indirect=True)
@pytest.mark.parametrize("fault", list(INPROC_FAULTS))
def test_transfer_that_fails_mid_stream_with_policy_fail_errors(pair: Pair, fault: str) -> None:
    _check_fail(pair, INPROC_FAULTS[fault])


def _check_fail(pair: Pair, fault: FaultInjection) -> None:
    asyncio.run(reset_prefix_cache(pair.decode.engine))  # pull every block
    pair.set_faults(fault)
    got = asyncio.run(
        handoff(pair.prefill, pair.decode_fail, new_request_id(), PROMPTS["len70"], GREEDY)
    )
    assert len(got.chunks) == 1
    last = got.chunks[0]
    assert last.finished and last.finish_reason == "error" and last.token_ids == []
    assert last.error is not None and last.error.kind == "TransferError"
    assert last.error.status_code == 503 and last.error.retryable
    assert last.error is not None and "failed" in last.error.message


def test_layout_mismatch_is_refused_and_the_export_freed(pair: Pair) -> None:
    async def main() -> list[TokenChunk]:
        request_id, prompt = new_request_id(), PROMPTS["len33"]
        result = await prefill(pair.prefill, request_id, prompt, GREEDY)
        assert result.kv_handle is not None
        forged = dataclasses.replace(
            result, kv_handle=dataclasses.replace(result.kv_handle, layout_fingerprint="bogus")
        )
        return await collect(pair.decode, decode_request(request_id, prompt, GREEDY, forged))

    chunks = asyncio.run(main())
    assert [c.error.kind if c.error else None for c in chunks] == ["LayoutMismatchError"]
    assert chunks[0].finished and chunks[0].error is not None


def test_client_disconnect_mid_stream_frees_both_sides(pair: Pair) -> None:
    params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)

    async def main() -> None:
        request_id, prompt = new_request_id(), PROMPTS["len150"]
        result = await prefill(pair.prefill, request_id, prompt, params)
        stream = pair.decode.generate(decode_request(request_id, prompt, params, result))
        first = await anext(stream)
        second = await anext(stream)
        assert len(first.token_ids) == len(second.token_ids) == 1 and not second.finished
        assert pair.decode.stats().kv_blocks_used > 0
        await stream.aclose()  # the client went away

    asyncio.run(main())  # the fixture then waits for both sides to hold nothing


def test_client_disconnect_during_the_pull_frees_both_sides(pair: Pair) -> None:
    pair.set_faults(FaultInjection(delay_per_chunk_s=5.0))

    async def main() -> None:
        request_id, prompt = new_request_id(), PROMPTS["len150"]
        result = await prefill(pair.prefill, request_id, prompt, GREEDY)
        stream = pair.decode.generate(decode_request(request_id, prompt, GREEDY, result))
        pending = asyncio.ensure_future(anext(stream))
        assert await async_wait_until(lambda: pair.decode.stats().transfer.in_flight == 1)
        assert pair.decode.stats().kv_blocks_used > 0
        pending.cancel()  # the client went away while the KV was on its way
        with pytest.raises(asyncio.CancelledError):
            await pending

    asyncio.run(main())


def test_abort_during_the_pull_ends_the_stream(pair: Pair) -> None:
    pair.set_faults(FaultInjection(delay_per_chunk_s=5.0))

    async def main() -> list[TokenChunk]:
        request_id, prompt = new_request_id(), PROMPTS["len70"]
        result = await prefill(pair.prefill, request_id, prompt, GREEDY)
        consumer = asyncio.ensure_future(
            collect(pair.decode, decode_request(request_id, prompt, GREEDY, result))
        )
        assert await async_wait_until(lambda: pair.decode.stats().transfer.in_flight == 1)
        assert await pair.decode.abort(request_id)
        return await asyncio.wait_for(consumer, timeout=5.0)

    chunks = asyncio.run(main())
    assert [(c.finished, c.finish_reason, c.token_ids) for c in chunks] == [(True, "abort", [])]


def test_abort_while_decoding_ends_the_stream(pair: Pair) -> None:
    params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)

    async def main() -> list[TokenChunk]:
        request_id, prompt = new_request_id(), PROMPTS["len33"]
        result = await prefill(pair.prefill, request_id, prompt, params)
        chunks: list[TokenChunk] = []
        async for chunk in pair.decode.generate(decode_request(request_id, prompt, params, result)):
            chunks.append(chunk)
            if len(chunks) == 2:
                assert await pair.decode.abort(request_id)
        return chunks

    chunks = asyncio.run(main())
    assert chunks[-1].finished and chunks[-1].finish_reason == "abort"
    assert 2 <= len(chunks) < 400


def test_unpulled_export_is_freed_when_its_lease_expires(
    pair: Pair, reference: dict[str, list[int]]
) -> None:
    """An export nobody pulls is freed by its lease; a decode that comes too late recomputes."""
    short = PrefillWorker(pair.prefill.engine, pair.make_exporter(0.2))
    pair.extra.append(short)
    engine = short.engine

    async def main() -> None:
        request_id, prompt = new_request_id(), PROMPTS["len70"]
        result = await prefill(short, request_id, prompt, GREEDY)
        assert short.stats().exports_pinned == 1 and engine.stats().num_pinned == 1
        assert await async_wait_until(lambda: short.stats().exports_pinned == 0)
        assert await async_wait_until(lambda: engine.stats().num_used_blocks == 0)
        assert short.stats().transfer.leases_expired_total == 1
        failures_before = pair.decode.stats().transfer.failures_total
        chunks = await collect(pair.decode, decode_request(request_id, prompt, GREEDY, result))
        tokens = [result.first_token_id] + [t for c in chunks for t in c.token_ids]
        assert tokens == reference["len70"]
        assert pair.decode.stats().transfer.failures_total == failures_before + 1

    asyncio.run(main())


@pytest.mark.parametrize("num_yields", [0, 1, 3, 10])
def test_cancelled_prefill_frees_its_blocks(pair: Pair, num_yields: int) -> None:
    async def main() -> None:
        run = prefill(pair.prefill, new_request_id(), PROMPTS["len150"], GREEDY)
        task = asyncio.ensure_future(run)
        for _ in range(num_yields):
            await asyncio.sleep(0)  # let the prefill get a little further each time
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


class _GatedTransport:
    """Delegates to a real transport; ``export`` (on the engine thread) waits for a gate."""

    def __init__(self, inner: KVTransport) -> None:
        self.inner = inner
        self.entered = threading.Event()
        self.gate = threading.Event()

    def export(self, block_ids: Sequence[int], on_release: OnRelease | None = None) -> KVHandle:
        self.entered.set()
        assert self.gate.wait(10.0)
        return self.inner.export(block_ids, on_release)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_prefill_cancelled_during_its_export_releases_it(pair: Pair) -> None:
    gated = _GatedTransport(pair.prefill.transport)
    worker = PrefillWorker(pair.prefill.engine, gated)  # type: ignore[arg-type]
    pair.extra.append(worker)

    async def main() -> None:
        task = asyncio.ensure_future(prefill(worker, new_request_id(), PROMPTS["len70"], GREEDY))
        assert await async_wait_until(gated.entered.is_set)
        task.cancel()  # the engine thread is inside export(): the handle is not ours yet
        with pytest.raises(asyncio.CancelledError):
            await task
        gated.gate.set()

    asyncio.run(main())  # the fixture then checks that the export was released and unpinned
