"""The pipelined handoff at the ingress: the decode call starts on the prefill's first answer
(its open export, no first token), the first token still reaches the client first, and every
way the prefill or the pipelined decode fails ends cleanly: a failed prefill closes the started
decode and falls back to local prefill, a first token that ends the request closes it, and a
pipelined decode that fails is continued elsewhere."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from core.errors import TransferError
from tests.unit.cluster.ingress.fakes import (
    MODEL,
    PULL_FAILED,
    FakeDecode,
    FakePrefill,
    Harness,
    run,
)
from tests.waiting import async_wait_until

LONG = "hello world, this is a long prompt"


async def complete(h: Harness, prompt: str = LONG) -> Any:
    async with h.client() as client:
        return await client.post("/v1/completions", json={"model": MODEL, "prompt": prompt})


def test_the_decode_starts_before_the_prefill_answers(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(prefill=FakePrefill(delay_s=0.3), pipelined_from_tokens=0)

    async def go() -> Any:
        response = asyncio.create_task(complete(h))
        await async_wait_until(lambda: h.decode.requests, 2.0, "the decode call")
        assert not response.done()  # the prefill still computes
        return await response

    r = run(go())
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "hello"  # first token + the decode's tokens
    (decode_req,) = h.decode.requests
    assert decode_req.kv_handle is not None and decode_req.kv_handle.pipelined
    assert decode_req.first_token_id is None  # the export tells the decode


def test_short_prompts_keep_the_one_shot_handoff(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(pipelined_from_tokens=1000)
    assert run(complete(h)).status_code == 200
    (decode_req,) = h.decode.requests
    assert decode_req.first_token_id is not None and not decode_req.kv_handle.pipelined


def test_a_prefill_failing_mid_pipeline_closes_the_decode_and_goes_local(
    make_harness: Callable[..., Harness],
) -> None:
    failing = FakePrefill(error_after_start=RuntimeError("prefill replica died"), delay_s=0.05)
    h = make_harness(prefill=failing, pipelined_from_tokens=0)
    r = run(complete(h))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == "hello"  # decode ran the whole request locally
    pipelined, local = h.decode.requests
    assert pipelined.kv_handle is not None and pipelined.kv_handle.pipelined
    assert local.kv_handle is None and local.first_token_id is None
    assert h.decode.num_closed == 2  # the started pipelined stream was closed, not leaked


def test_a_first_token_that_ends_the_request_closes_the_started_decode(
    make_harness: Callable[..., Harness],
) -> None:
    waiting = FakeDecode(release=asyncio.Event())  # the decode waits for its KV meanwhile
    prefill = FakePrefill(finish_reason="stop", delay_s=0.05)
    h = make_harness(prefill=prefill, decode=waiting, pipelined_from_tokens=0)
    r = run(complete(h))
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == "h" and choice["finish_reason"] == "stop"
    assert len(h.decode.requests) == 1 and h.decode.num_closed == 1


def test_a_failed_pipelined_pull_continues_after_the_first_token(
    make_harness: Callable[..., Harness],
) -> None:
    decode = FakeDecode(fail_after=0)  # the pipelined stream ends with the pull's error

    def heal(_: object) -> None:  # the stream the ingress continues on works
        if len(decode.requests) > 1:
            decode.fail_after = None

    decode.on_start = heal
    h = make_harness(decode=decode, pipelined_from_tokens=0)
    r = run(complete(h))
    assert r.status_code == 200, r.text
    pipelined, migrated = h.decode.requests
    assert pipelined.kv_handle is not None and pipelined.kv_handle.pipelined
    # migrated: a local prefill of prompt + the first token the client already has
    assert migrated.kv_handle is None and migrated.prompt_token_ids[-1] == 104
    assert r.json()["usage"]["completion_tokens"] == 4  # the first token, then the local three
    assert isinstance(PULL_FAILED, TransferError)
