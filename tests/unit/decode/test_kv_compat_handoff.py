"""KV compatibility end to end through the roles: the real builders give both workers the
fingerprint of their engine (checkpoint revision, layout, hash seed, ...) and publish it in their
stats; a decode handed the KV of a prefill with another fingerprint refuses the pull before any
byte moves and ends the request with a typed ``TransferError`` (reason ``kv_incompatible``) —
never a recompute after another version's first token — over gRPC and in process alike."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from core.ids import new_request_id
from core.kv_compat import KVCompat
from core.kv_handle import TransferFailure
from decode.worker import DecodeWorker
from engine.checkpoint import checkpoint_revision
from prefill.worker import PrefillWorker
from tests.unit.decode.helpers import handoff
from tests.unit.decode.pd_pair import TRANSFER, Pair
from tests.unit.engine.async_engine.tiny_engine import GREEDY, PROMPTS, reset_prefix_cache
from transfer import GrpcKVTransport, InProcKVTransport, KVTransport

pytestmark = pytest.mark.timeout(60)


def test_the_builders_publish_one_fingerprint_of_the_checkpoint(
    grpc_workers: tuple[PrefillWorker, DecodeWorker],
) -> None:
    prefill, decode = grpc_workers
    assert prefill.kv_compat is not None and prefill.kv_compat == decode.kv_compat
    parts = prefill.engine.engine.parts
    assert prefill.kv_compat.model_revision == checkpoint_revision(parts.model_dir)
    assert prefill.kv_compat.layout == parts.layout.unsplit().fingerprint()
    fingerprint = prefill.kv_compat.fingerprint()
    assert prefill.stats().kv_fingerprint == decode.stats().kv_fingerprint == fingerprint


def _transports(pair: Pair, exporter: KVCompat, importer: KVCompat) -> list[KVTransport]:
    """An exporter over the prefill engine's storage and an importer over the decode's."""
    prefill_storage = pair.prefill.engine.engine.parts.storage
    decode_storage = pair.decode.engine.engine.parts.storage
    if pair.kind == "grpc":
        wire = TRANSFER.model_copy(update={"same_node": "off"})
        return [
            GrpcKVTransport(prefill_storage, TRANSFER, serve=True, kv_compat=exporter),
            GrpcKVTransport(decode_storage, wire, serve=False, kv_compat=importer),
        ]
    assert pair.hub is not None
    return [
        InProcKVTransport(prefill_storage, pair.hub, kv_compat=exporter),
        InProcKVTransport(decode_storage, pair.hub, kv_compat=importer),
    ]


@pytest.mark.parametrize("same", [True, False], ids=["same-fingerprint", "other-revision"])
def test_a_decode_pulls_only_from_a_prefill_of_its_fingerprint(
    pair: Pair,
    grpc_workers: tuple[PrefillWorker, DecodeWorker],
    reference: dict[str, list[int]],
    same: bool,
) -> None:
    mine = grpc_workers[0].kv_compat
    assert mine is not None
    other = mine if same else dataclasses.replace(mine, model_revision="another-checkpoint")
    exporter, importer = _transports(pair, other, mine)
    pair.closables += [exporter, importer]
    prefill = PrefillWorker(pair.prefill.engine, exporter, kv_compat=other)
    decode = DecodeWorker(pair.decode.engine, importer, kv_compat=mine)
    asyncio.run(reset_prefix_cache(pair.decode.engine))  # pull every block
    failures_before = decode.stats().transfer.failures_total
    got = asyncio.run(handoff(prefill, decode, new_request_id(), PROMPTS["len70"], GREEDY))
    if same:
        assert got.token_ids == reference["len70"]
        assert all(c.error is None for c in got.chunks)
        return
    assert len(got.chunks) == 1, got.chunks
    error = got.chunks[0].error
    assert got.chunks[0].finish_reason == "error" and got.chunks[0].token_ids == []
    assert error is not None and error.kind == "TransferError"
    assert error.reason == TransferFailure.KV_INCOMPATIBLE
    assert "model_revision" in error.message or "refusing the pull" in error.message
    transfer = decode.stats().transfer
    assert transfer.failures_total == failures_before + 1
