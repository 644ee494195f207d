"""The transport connector's pulls as the engine sees them, over a transport whose pulls end only
when the test says: freeing a request whose pull still writes never waits (its blocks are held
until the pull stopped, then freed); an ``AsyncEngine`` idle on its command queue is woken by a
pull's end and settles it; a pull into the host mirror is uploaded to the device on settling."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from typing import cast

import pytest

from core.config import EngineConfig, ModelConfig
from core.kv_handle import KVHandle, TransferFailure
from core.sampling import SamplingParams
from engine.async_engine import AsyncEngine
from engine.engine import LLMEngine
from engine.kv_connector.connected_engine import ConnectedEngine
from engine.request import RequestStatus
from engine.setup import build_engine_parts
from replica.kv_connector.transport_connector import TransportKVConnector
from tests.waiting import async_wait_until
from transfer import KVTransport, TransferTask

pytestmark = pytest.mark.timeout(60)

MODEL = ModelConfig(name="builtin:tiny-llama")
ENGINE = EngineConfig(max_model_len=128, kv_cache_memory_bytes=4 << 20, block_size=16)
GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
PROMPT = list(range(3, 43))  # 40 tokens: three blocks
FIRST_TOKEN = 7


class HeldPulls:
    """The transport calls the connector makes on the import side; pulls stay running."""

    def __init__(self) -> None:
        self.tasks: list[TransferTask] = []
        self.released: list[str] = []

    def pull(
        self, handle: KVHandle, dst_block_ids: Sequence[int], wanted: Sequence[int] | None = None
    ) -> TransferTask:
        task = TransferTask(handle.transfer_id, tuple(dst_block_ids), 0)
        self.tasks.append(task)
        return task

    def release(self, handle: KVHandle) -> None:
        self.released.append(handle.transfer_id)


def _handle(engine: LLMEngine, transfer_id: str = "xfer-1") -> KVHandle:
    return KVHandle(
        transfer_id=transfer_id,
        address="inproc://nowhere",
        num_blocks=3,
        block_bytes=engine.parts.layout.block_bytes,
        layout_fingerprint=engine.parts.layout.fingerprint(),
        lease_deadline_unix_ms=int((time.time() + 60) * 1000),
        exporter_epoch="epoch",
    )


@pytest.fixture(scope="module")
def llm_engine() -> LLMEngine:
    return LLMEngine(build_engine_parts(MODEL, ENGINE))


@pytest.fixture
def connected(llm_engine: LLMEngine) -> Iterator[tuple[ConnectedEngine, HeldPulls]]:
    transport = HeldPulls()
    connector = TransportKVConnector(cast(KVTransport, transport))
    yield ConnectedEngine(llm_engine, connector), transport
    connector.close()
    llm_engine.scheduler.check_integrity()


def test_freeing_a_request_mid_pull_holds_its_blocks_until_the_pull_stopped(
    connected: tuple[ConnectedEngine, HeldPulls],
) -> None:
    engine_side, transport = connected
    engine, connector = engine_side.engine, engine_side.connector
    kv = engine.scheduler.kv
    num_free = kv.num_free_blocks
    source = connector.add_source(_handle(engine))
    engine_side.add_import("r", PROMPT, GREEDY, source, first_token_id=FIRST_TOKEN)
    connector.start_transfers()
    (task,) = transport.tasks
    task.mark_transferring()

    started_s = time.monotonic()
    assert engine.abort("r")  # NOTE: the pull never ends on its own: a wait would hang here
    assert time.monotonic() - started_s < 1.0
    assert task.cancel_requested
    assert kv.num_held_blocks == 3 and kv.num_free_blocks == num_free - 3
    kv.check_integrity()
    assert connector.take_finished().is_empty

    task.mark_failed(TransferFailure.CANCELLED, "cancelled", ())
    assert connector.wait(1.0)
    finished = connector.take_finished()
    assert finished.stopped_writes == ("r",) and finished.imports == ()
    assert engine_side.settle(finished) == []
    assert kv.num_held_blocks == 0 and kv.num_free_blocks == num_free
    assert transport.released == []  # a pull that started frees the export itself


def test_freeing_a_request_before_its_pull_started_releases_the_export(
    connected: tuple[ConnectedEngine, HeldPulls],
) -> None:
    engine_side, transport = connected
    engine, connector = engine_side.engine, engine_side.connector
    num_free = engine.scheduler.kv.num_free_blocks
    source = connector.add_source(_handle(engine, "xfer-queued"))
    engine_side.add_import("q", PROMPT, GREEDY, source, first_token_id=FIRST_TOKEN)
    assert engine.abort("q")
    assert engine.scheduler.kv.num_free_blocks == num_free  # nothing wrote them: freed at once
    connector.close()  # waits for the release thread
    assert transport.released == ["xfer-queued"]
    connector.start_transfers()
    assert transport.tasks == []


def test_a_pull_into_the_host_mirror_is_uploaded_before_the_request_runs(
    connected: tuple[ConnectedEngine, HeldPulls], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine_side, transport = connected
    engine, connector = engine_side.engine, engine_side.connector
    uploaded: list[list[int]] = []
    monkeypatch.setattr(engine.parts.storage, "stage_to_device", uploaded.append)
    source = connector.add_source(_handle(engine, "xfer-host"))
    allocation = engine_side.add_import("h", PROMPT, GREEDY, source, first_token_id=FIRST_TOKEN)
    connector.start_transfers()
    (task,) = transport.tasks
    task.mark_done()
    assert engine_side.settle(connector.take_finished()) == []
    assert uploaded == [allocation.block_ids]
    request = engine.scheduler.get_request("h")
    assert request is not None and request.status is RequestStatus.WAITING
    assert engine.abort("h")


def test_an_idle_async_engine_is_woken_to_free_the_held_blocks() -> None:
    llm_engine = LLMEngine(build_engine_parts(MODEL, ENGINE))
    transport = HeldPulls()
    connector = TransportKVConnector(cast(KVTransport, transport))
    engine = AsyncEngine(llm_engine, connector=connector)

    async def num_held() -> int:
        return await engine.call(lambda e: e.scheduler.kv.num_held_blocks)

    async def main() -> None:
        num_free = engine.stats().num_free_blocks
        opened = await engine.import_through(
            connector, connector.add_source(_handle(llm_engine)), "a", PROMPT, GREEDY, FIRST_TOKEN
        )
        await async_wait_until(lambda: transport.tasks)  # started after the command, unasked
        (task,) = transport.tasks
        task.mark_transferring()
        assert await asyncio.wait_for(engine.abort("a"), 1.0)  # the engine thread never waits
        assert await asyncio.wait_for(asyncio.wrap_future(opened.ended), 1.0) is None
        assert await num_held() == 3
        task.mark_failed(TransferFailure.CANCELLED, "cancelled", ())
        # NOTE: no command follows: only the connector's wake-up can make the thread settle
        assert await async_wait_until(lambda: engine.stats().num_free_blocks == num_free)
        assert await num_held() == 0
        await engine.call(lambda e: e.scheduler.check_integrity())

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
        connector.close()


def test_an_import_through_a_connector_not_attached_is_refused_leaving_nothing() -> None:
    llm_engine = LLMEngine(build_engine_parts(MODEL, ENGINE))
    engine = AsyncEngine(llm_engine)
    connector = TransportKVConnector(cast(KVTransport, HeldPulls()))

    async def main() -> None:
        num_free = engine.stats().num_free_blocks
        source = connector.add_source(_handle(llm_engine))
        with pytest.raises(ValueError, match="not attached"):
            await engine.import_through(connector, source, "n", PROMPT, GREEDY, FIRST_TOKEN)
        assert engine.stats().num_free_blocks == num_free
        assert engine.stats().num_waiting_for_kv == 0

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
        connector.close()
