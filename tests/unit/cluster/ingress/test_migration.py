"""Request migration: a decode stream that dies continues on another replica with the tokens
already sent, nothing repeated or lost, counted by reason and bounded by migration_limit."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from cluster.ingress.app.fastapi_app import create_app
from cluster.ingress.model_table import ModelEndpoint
from core.kv_handle import KVHandle
from core.messages import DecodeRequest, PrefixExport, TokenChunk
from engine.tokenizer import Tokenizer
from tests.unit.cluster.ingress.fakes import (
    MODEL,
    FakeDecode,
    Harness,
    over_the_wire,
    run,
    settings_with,
    sse_payloads,
)

LONG = "hello world, this is a long prompt"  # over the local-prefill threshold: remote


class DyingOnce(FakeDecode):
    """The first stream raises after ``raise_after`` chunks (its replica died); later streams
    (other replicas) continue the request from what they are given."""

    def generate(self, request: DecodeRequest) -> Any:
        if self.requests:
            self.raise_after = None
        return super().generate(request)


def post(h: Harness, body: dict[str, Any]) -> httpx.Response:
    async def go() -> httpx.Response:
        async with h.client() as client:
            return await client.post("/v1/completions", json={"model": MODEL, **body})

    return run(go())


def metric(h: Harness, text: str) -> str:
    async def go() -> str:
        async with h.client() as client:
            return (await client.get("/metrics")).text

    lines = [line for line in run(go()).splitlines() if line.startswith(text)]
    return lines[0] if lines else ""


def test_a_dying_stream_continues_on_another_replica(
    make_harness: Callable[..., Harness], tokenizer: Tokenizer
) -> None:
    decode = DyingOnce(steps=[(101, "e"), (108, "l"), (109, "m"), (110, "n")], raise_after=2)
    h = make_harness(decode=decode)
    r = post(h, {"prompt": LONG, "max_tokens": 5, "stream": True})
    assert r.status_code == 200
    *chunks, done = sse_payloads(r.text)
    text = "".join(c["choices"][0]["text"] for c in chunks)
    # first token from prefill, two from the dying replica, the rest from the new one
    first, moved = decode.requests
    assert moved.first_token_id is None and moved.kv_handle is None  # a local prefill
    sent = moved.prompt_token_ids[len(first.prompt_token_ids) :]
    assert moved.prompt_token_ids[: len(first.prompt_token_ids)] == first.prompt_token_ids
    assert len(sent) == 3 and moved.sampling.max_tokens == first.sampling.max_tokens - 3
    assert moved.request_id == f"{first.request_id}-m1"
    assert len(moved.routing.block_hashes) == len(moved.prompt_token_ids) // 4
    assert done == "[DONE]" and chunks[-1]["choices"][0]["finish_reason"] is not None
    # the prefill's token, the dead replica's two, then the new replica's whole local stream
    assert len(chunks) == 1 + 2 + len(decode.local_steps) and text
    assert 'reason="replica_failed"} 1.0' in metric(h, "pdserve:request_migrations_total")


EXPORT = PrefixExport(
    (11, 12),
    KVHandle("handoff-1", "10.0.0.9:7000", 2, 64, "layout", 0, "epoch"),
)


class HandingOffOnce(FakeDecode):
    """The first stream is handed off after two tokens: its leaving replica ends it with an
    aborted chunk carrying the export of its blocks."""

    async def _stream(self, request: DecodeRequest) -> AsyncIterator[TokenChunk]:
        if len(self.requests) > 1:
            async for chunk in super()._stream(request):
                yield chunk
            return
        for token_id, text in self.steps[:2]:
            yield self._chunk(request, [token_id], text)
        aborted = TokenChunk(request.request_id, [], "", True, "abort", handoff=EXPORT)
        yield over_the_wire(aborted)


def test_a_handed_off_stream_continues_with_the_export_of_its_blocks(
    make_harness: Callable[..., Harness],
) -> None:
    decode = HandingOffOnce(steps=[(101, "e"), (108, "l"), (109, "m"), (110, "n")])
    h = make_harness(decode=decode)
    r = post(h, {"prompt": LONG, "max_tokens": 5, "stream": True})
    assert r.status_code == 200 and sse_payloads(r.text)[-1] == "[DONE]"
    first, moved = decode.requests
    assert first.warm_from is None and moved.warm_from == EXPORT  # pulled, not recomputed
    assert moved.kv_handle is None  # a local prefill of prompt and tokens so far
    assert moved.prompt_token_ids[len(first.prompt_token_ids) :] == moved.prompt_token_ids[-3:]
    assert 'reason="handed_off"} 1.0' in metric(h, "pdserve:request_migrations_total")


def test_migration_stops_at_the_limit_and_never_for_the_requests_own_errors(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(decode=FakeDecode(raise_after=1), migration_limit=2)
    r = post(h, {"prompt": LONG, "max_tokens": 8, "stream": True})
    *_, error, done = sse_payloads(r.text)
    assert error["error"]["type"] == "service_unavailable" and done == "[DONE]"
    assert len(h.decode.requests) == 3  # the first stream and two migrations
    h2 = make_harness(decode=FakeDecode(fail_after=1))  # a failed KV pull: an error chunk
    post(h2, {"prompt": LONG, "max_tokens": 8})
    assert len(h2.decode.requests) > 1  # a replica-side failure migrates too


def test_resumed_text_keeps_a_character_split_by_the_break(tokenizer: Tokenizer) -> None:
    from cluster.ingress.dispatch.migration import ResumedText
    from engine.tokenizer import IncrementalDetokenizer

    prompt = tokenizer.encode("Say:")
    output = tokenizer.encode("café au lait", add_special_tokens=False)
    split = output.index(tokenizer.encode("é", add_special_tokens=False)[0]) + 1  # mid-"é"
    first = IncrementalDetokenizer(tokenizer, prompt_token_ids=prompt)
    text_sent = "".join(first.step([t]) for t in output[:split])  # "caf": é's byte held back
    assert text_sent == "caf"
    resumed = ResumedText(
        IncrementalDetokenizer(tokenizer, prompt_token_ids=prompt), output[:split], text_sent
    )
    rest = [resumed.render([t], i == len(output) - split - 1) for i, t in enumerate(output[split:])]
    assert text_sent + "".join(rest) == "café au lait"


def test_an_app_rebuilt_in_place_keeps_counting_on_its_predecessors_metrics(
    make_harness: Callable[..., Harness], tokenizer: Tokenizer
) -> None:
    """An in-place upgrade rebuilds the ingress app (``IngressDeployment.reconfigure``): its
    counters go on from the old app's, not from zero."""
    h = make_harness(decode=HandingOffOnce(steps=[(101, "e"), (108, "l"), (109, "m")]))
    post(h, {"prompt": LONG, "max_tokens": 4})
    endpoint = ModelEndpoint(tokenizer, h.prefill, FakeDecode(), settings_with())
    rebuilt = Harness(create_app([endpoint], metrics=h.app.metrics), h.prefill, FakeDecode())
    assert 'reason="handed_off"} 1.0' in metric(rebuilt, "pdserve:request_migrations_total")
    post(rebuilt, {"prompt": LONG, "max_tokens": 4})
    finished = metric(rebuilt, "pdserve:request_success_total")
    assert finished.endswith(" 2.0"), finished  # one request on each app
