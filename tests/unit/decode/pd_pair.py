"""Fixtures for the role tests: two real engines (prefill, decode) and a reference ``LLM``.

The engines are built once per session by the real builders (``build_prefill_worker`` /
``build_decode_worker``, gRPC on 127.0.0.1); the in-process pair wraps the same engines with
``InProcKVTransport``s, so every test runs over both transports without loading more models.
The prefill's KV lives in shared memory: the in-process pair copies it on the same-node path,
while the gRPC decode has ``transfer.same_node: off`` and pulls the bytes over the wire.
Each test must leave both engines quiescent (no used blocks, no exports) — the ``pair`` fixture
checks that at teardown.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from core.config import EngineConfig, ModelConfig, TransferConfig
from core.sampling import SamplingParams
from decode.build import build_decode_worker
from decode.worker import DecodeWorker
from engine.async_engine import AsyncEngine
from engine.engine import LLMEngine
from engine.llm import LLM
from prefill.build import build_prefill_worker
from prefill.worker import PrefillWorker
from tests.waiting import wait_until
from transfer import FaultInjection, GrpcKVTransport, InProcKVHub, InProcKVTransport, KVTransport

MODEL = ModelConfig(name="builtin:tiny-llama")
ENGINE = EngineConfig(max_model_len=512, kv_cache_memory_bytes=16 << 20)
TRANSFER = TransferConfig(
    bind_host="127.0.0.1",
    insecure_test_token="roles-unit-test",
    pull_deadline_s=10.0,
    rpc_deadline_s=2.0,
)
BLOCK_SIZE = ENGINE.block_size
MAX_TOKENS = 12
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)


def _prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 250) for _ in range(length)]


# Lengths around block boundaries: < 1 block, exactly 1, 2 + 1 token, exactly 4, 4 + partial,
# and ten blocks (several in-process chunks).
PROMPTS: dict[str, list[int]] = {
    f"len{n}": _prompt(n, seed) for seed, n in enumerate((5, 16, 33, 64, 70, 150))
}


@dataclass
class Pair:
    """A prefill worker and decode workers (one per failure policy) over one transport kind."""

    kind: str
    prefill: PrefillWorker
    decode: DecodeWorker
    decode_fail: DecodeWorker
    set_faults: Callable[[FaultInjection], None]
    make_exporter_of: Callable[[float], KVTransport]
    hub: InProcKVHub | None = None
    extra: list[PrefillWorker] = field(default_factory=list)
    closables: list[KVTransport] = field(default_factory=list)

    def make_exporter(self, lease_s: float) -> KVTransport:
        """Another exporter over the prefill engine's storage, with its own lease; closed at
        teardown, reachable by ``decode``."""
        transport = self.make_exporter_of(lease_s)
        self.closables.append(transport)
        return transport

    @property
    def block_bytes(self) -> int:
        """Bytes of one KV block."""
        return self.prefill.engine.engine.parts.layout.block_bytes


@pytest.fixture(scope="session")
def offline_llm() -> LLM:
    """The offline API on its own engine: the reference, and the engine of AsyncEngine tests."""
    return LLM(MODEL.name, max_model_len=512, kv_cache_memory_bytes=16 << 20)


@pytest.fixture(scope="session")
def reference(offline_llm: LLM) -> dict[str, list[int]]:
    """Greedy token ids of every prompt from the offline ``LLM`` (the peer)."""
    llm = offline_llm
    outputs = llm.generate(prompt_token_ids=list(PROMPTS.values()), sampling_params=GREEDY)
    refs = {name: list(out.token_ids) for name, out in zip(PROMPTS, outputs, strict=True)}
    for name, ids in refs.items():
        assert len(ids) == MAX_TOKENS, f"{name} hits EOS early; pick another seed"
    return refs


@pytest.fixture(scope="session")
def grpc_workers() -> Iterator[tuple[PrefillWorker, DecodeWorker]]:
    """Both workers from the real builders; shut down at the end of the session."""
    prefill = build_prefill_worker(MODEL, ENGINE, TRANSFER)
    wire = TRANSFER.model_copy(update={"same_node": "off"})  # the gRPC pair moves bytes
    decode = build_decode_worker(MODEL, ENGINE, wire, kv_failure_policy="recompute")
    yield prefill, decode
    asyncio.run(decode.shutdown())
    asyncio.run(prefill.shutdown())


def make_pair(kind: str, prefill: PrefillWorker, decode: DecodeWorker) -> Pair:
    storage = prefill.engine.engine.parts.storage
    if kind == "grpc":
        transport = prefill.transport
        assert isinstance(transport, GrpcKVTransport) and transport.server is not None
        fail = DecodeWorker(decode.engine, decode.transport, kv_failure_policy="fail")

        def grpc_exporter(lease_s: float) -> KVTransport:
            config = TRANSFER.model_copy(update={"lease_s": lease_s})
            return GrpcKVTransport(storage, config, serve=True)

        return Pair(kind, prefill, decode, fail, transport.server.set_faults, grpc_exporter)
    hub = InProcKVHub()
    chunk_bytes = 2 * storage.layout.block_bytes  # several chunks per pull
    exporter = InProcKVTransport(storage, hub, chunk_bytes=chunk_bytes)
    importer = InProcKVTransport(decode.engine.engine.parts.storage, hub)
    pair = Pair(
        kind,
        PrefillWorker(prefill.engine, exporter),
        DecodeWorker(decode.engine, importer, kv_failure_policy="recompute"),
        DecodeWorker(decode.engine, importer, kv_failure_policy="fail"),
        exporter.set_faults,
        lambda lease_s: InProcKVTransport(storage, hub, lease_s=lease_s),
        hub,
    )
    pair.closables += [exporter, importer]
    return pair


@pytest.fixture(params=["inproc", "grpc"])
def pair(
    request: pytest.FixtureRequest, grpc_workers: tuple[PrefillWorker, DecodeWorker]
) -> Iterator[Pair]:
    """A prefill/decode pair over one transport; checked quiescent and fault-free at teardown."""
    made = make_pair(request.param, *grpc_workers)
    try:
        yield made
        assert_quiescent(made)
    finally:
        made.set_faults(FaultInjection())
        for transport in made.closables:
            transport.close()


def assert_quiescent(pair: Pair, timeout_s: float = 5.0) -> None:
    """No used KV block, no live export, no pull in flight, consistent bookkeeping — both sides."""
    workers: list[PrefillWorker | DecodeWorker] = [pair.prefill, *pair.extra, pair.decode]

    def idle() -> bool:
        for worker in workers:
            stats = worker.stats()
            if stats.kv_blocks_used or stats.transfer.in_flight or stats.exports_pinned:
                return False
            if stats.num_running or stats.num_waiting:
                return False
        return True

    assert wait_until(idle, timeout_s), [w.stats() for w in workers]
    for engine in (pair.prefill.engine, pair.decode.engine):
        asyncio.run(check_integrity(engine))


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
