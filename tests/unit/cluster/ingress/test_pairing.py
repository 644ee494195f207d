"""Pairing by KV fingerprint at the ingress: a request's prefill and decode name one
fingerprint (that of a live decode, weighted by how many serve it); with no prefill of that
fingerprint the decode prefills locally; a decode after a remote prefill is routed to the
fingerprint of the handle's exporter."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from cluster.ingress import create_app
from cluster.ingress.dispatch.migration import migrated_request
from cluster.ingress.dispatch.pairing import Pairing, choose_pairing
from cluster.ingress.dispatch.pool_requests import decode_request, pipelined_decode_request
from cluster.ingress.dispatch.prepared_prompt import PreparedPrompt
from cluster.ingress.model_table import ModelEndpoint
from core.kv_compat import KVCompat
from core.messages import DecodeRequest, PrefillResult, RoutingKeys
from core.sampling import SamplingParams
from engine.tokenizer import Tokenizer
from tests.unit.cluster.ingress.fakes import (
    HANDLE,
    FakeDecode,
    FakePrefill,
    Harness,
    run,
    settings_with,
)
from tests.unit.cluster.ingress.test_flow import LONG, complete, decisions

pytestmark = pytest.mark.timeout(30)


@dataclass
class Versions:
    """``FleetVersions`` as a test sets it."""

    decode: dict[str, int] = field(default_factory=dict)
    prefill: dict[str, int] = field(default_factory=dict)

    def decode_fingerprints(self) -> Mapping[str, int]:
        return self.decode

    def prefill_fingerprints(self) -> Mapping[str, int]:
        return self.prefill


def harness(tokenizer: Tokenizer, versions: Versions) -> Harness:
    prefill, decode = FakePrefill(), FakeDecode()
    endpoint = ModelEndpoint(tokenizer, prefill, decode, settings_with(), versions=versions)
    return Harness(create_app([endpoint]), prefill, decode)


def test_prefill_and_decode_name_the_same_fingerprint(tokenizer: Tokenizer) -> None:
    h = harness(tokenizer, Versions(decode={"new": 2}, prefill={"new": 1, "old": 1}))
    assert run(complete(h, LONG)).status_code == 200
    assert [r.routing.kv_fingerprint for r in h.prefill.requests] == ["new"]
    assert [r.routing.kv_fingerprint for r in h.decode.requests] == ["new"]
    assert h.decode.requests[0].kv_handle is not None  # remote: a prefill of "new" is live


def test_without_a_prefill_of_the_decodes_fingerprint_the_decode_prefills_locally(
    tokenizer: Tokenizer,
) -> None:
    h = harness(tokenizer, Versions(decode={"new": 1}, prefill={"old": 3}))
    assert run(complete(h, LONG)).status_code == 200
    assert h.prefill.requests == []  # never a pull across versions
    (request,) = h.decode.requests
    assert request.kv_handle is None and request.first_token_id is None
    assert request.routing.kv_fingerprint == "new"
    assert decisions(h) == {("local", "no_prefill_capacity"): 1.0}


def test_undeclared_fingerprints_pair_anything(tokenizer: Tokenizer) -> None:
    h = harness(tokenizer, Versions(decode={"": 1}, prefill={"": 1}))
    assert run(complete(h, LONG)).status_code == 200
    assert len(h.prefill.requests) == 1
    assert h.decode.requests[0].routing.kv_fingerprint == ""


def test_the_decode_fingerprint_is_drawn_by_live_decode_replicas() -> None:
    versions = Versions(decode={"old": 1, "new": 3, "": 5}, prefill={"old": 1})
    rng = random.Random(7)
    drawn = [choose_pairing(versions, rng) for _ in range(4000)]
    new = sum(1 for p in drawn if p is not None and p.kv_fingerprint == "new")
    assert 0.70 < new / len(drawn) < 0.80
    assert {p for p in drawn if p is not None} == {Pairing("new", False), Pairing("old", True)}
    assert choose_pairing(Versions(decode={"": 2}), rng) is None
    assert choose_pairing(Versions(), rng) is None


def test_a_decode_follows_the_fingerprint_its_handle_declares() -> None:
    compat = KVCompat(model_revision="rev", layout="layout")
    prompt = PreparedPrompt([1, 2, 3], SamplingParams(), RoutingKeys(kv_fingerprint="chosen"))
    declared = dataclasses.replace(HANDLE, kv_compat=compat)
    result = PrefillResult("r", 7, "x", 0, declared)
    assert decode_request("r", prompt, result).routing.kv_fingerprint == compat.fingerprint()
    assert decode_request("r", prompt, None).routing.kv_fingerprint == "chosen"
    undeclared = dataclasses.replace(result, kv_handle=HANDLE)
    assert decode_request("r", prompt, undeclared).routing.kv_fingerprint == "chosen"
    pipelined = pipelined_decode_request("r", prompt, declared)
    assert pipelined.kv_handle == declared
    assert pipelined.routing.kv_fingerprint == compat.fingerprint()


def test_a_migrated_request_keeps_its_fingerprint_and_recomputes_the_tokens_so_far() -> None:
    keys = RoutingKeys((11,), 3, "session", None, kv_fingerprint="old")
    original = DecodeRequest("r", [1, 2, 3], SamplingParams(max_tokens=5), keys, 9, HANDLE)
    moved = migrated_request(original, [9, 8], 1, block_size=4, hash_seed=0)
    assert moved.routing.kv_fingerprint == "old"  # the same version while one serves
    assert moved.prompt_token_ids == [1, 2, 3, 9, 8] and moved.kv_handle is None
    assert moved.sampling.max_tokens == 3
