"""Request migration: a decode stream that dies continues on another replica with the tokens
already sent, nothing repeated or lost, counted by reason and bounded by migration_limit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx

from core.messages import DecodeRequest
from engine.tokenizer import Tokenizer
from tests.unit.cluster.ingress.fakes import MODEL, FakeDecode, Harness, run, sse_payloads

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
