"""Fixtures for the P/D hand-off tests: two real engines (prefill, decode), the pair over each
transport (``pd_pair.py``) and the offline ``LLM`` as the reference.

The engines are built once per session by the real builders; each test must leave both engines
quiescent (no used blocks, no exports) — the ``pair`` fixture checks that at teardown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from decode.build import build_decode_worker
from decode.worker import DecodeWorker
from engine.llm import LLM
from prefill.build import build_prefill_worker
from prefill.worker import PrefillWorker
from tests.unit.decode.pd_pair import TRANSFER, Pair, assert_quiescent, make_pair
from tests.unit.engine.async_engine.tiny_engine import (
    ENGINE,
    MODEL,
    greedy_reference,
    new_offline_llm,
)
from transfer import FaultInjection


@pytest.fixture(scope="session")
def offline_llm() -> LLM:
    """The offline API on its own engine: the reference."""
    return new_offline_llm()


@pytest.fixture(scope="session")
def reference(offline_llm: LLM) -> dict[str, list[int]]:
    """Greedy token ids of every prompt from the offline ``LLM`` (the peer)."""
    return greedy_reference(offline_llm)


@pytest.fixture(scope="session")
def grpc_workers() -> Iterator[tuple[PrefillWorker, DecodeWorker]]:
    """Both workers from the real builders; shut down at the end of the session."""
    prefill = build_prefill_worker(MODEL, ENGINE, TRANSFER)
    wire = TRANSFER.model_copy(update={"same_node": "off"})  # the gRPC pair moves bytes
    decode = build_decode_worker(MODEL, ENGINE, wire, kv_failure_policy="recompute")
    yield prefill, decode
    asyncio.run(decode.shutdown())
    asyncio.run(prefill.shutdown())


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
