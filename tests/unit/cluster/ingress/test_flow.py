"""The handoff: decisions and their counts, fallback, first token first, disconnects."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from starlette.requests import ClientDisconnect

from core.errors import OverloadedError, TransferError
from core.messages import DecodeRequest
from tests.unit.cluster.ingress.fakes import (
    MODEL,
    FakeDecode,
    FakePrefill,
    Harness,
    run,
    sse_payloads,
)
from tests.waiting import async_wait_until

LONG = "hello world, this is a long prompt"


def decisions(h: Harness) -> dict[tuple[str, str], float]:
    registry = h.app.metrics.registry
    counts = {}
    for family in registry.collect():
        if family.name == "pdserve:disagg_decisions":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[(sample.labels["decision"], sample.labels["reason"])] = sample.value
    return counts


async def complete(h: Harness, prompt: str) -> Any:
    async with h.client() as client:
        return await client.post("/v1/completions", json={"model": MODEL, "prompt": prompt})


def test_every_decision_is_counted_by_reason(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()
    for prompt in (LONG, LONG, "hi"):
        assert run(complete(h, prompt)).status_code == 200
    h.prefill.is_healthy = False
    assert run(complete(h, LONG)).status_code == 200
    assert decisions(h) == {
        ("remote", "long_prompt"): 2.0,
        ("local", "short_prompt"): 1.0,
        ("local", "no_prefill_capacity"): 1.0,
    }
    assert len(h.prefill.requests) == 2
    assert [r.first_token_id is None for r in h.decode.requests] == [False, False, True, True]


def test_threshold_zero_always_disaggregates(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(local_prefill_threshold_tokens=0)
    assert run(complete(h, "hi")).status_code == 200
    assert decisions(h) == {("remote", "long_prompt"): 1.0}


def test_failed_prefill_falls_back_to_local(make_harness: Callable[..., Harness]) -> None:
    for error in (RuntimeError("actor died"), TransferError("export failed", reason="internal")):
        h = make_harness(prefill=FakePrefill(error=error))
        r = run(complete(h, LONG))
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == "hello"  # decode ran the whole request
        (decode_req,) = h.decode.requests
        assert decode_req.first_token_id is None and decode_req.kv_handle is None
        assert decisions(h) == {("remote", "long_prompt"): 1.0, ("local", "prefill_failed"): 1.0}


def test_first_failed_prefill_sends_the_next_requests_local_at_once(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(prefill=FakePrefill(error=RuntimeError("actor died")))
    for _ in range(3):
        assert run(complete(h, LONG)).status_code == 200
    assert len(h.prefill.requests) == 1  # only the first paid for the dead pool
    assert decisions(h) == {
        ("remote", "long_prompt"): 1.0,
        ("local", "prefill_failed"): 1.0,
        ("local", "no_prefill_capacity"): 2.0,
    }
    metrics = run(h.client().get("/metrics")).text
    assert "pdserve:prefill_failovers_total 1.0" in metrics
    assert 'pdserve:serving_degraded{reason="prefill_unavailable"} 1.0' in metrics
    h.app.default_flow.breaker.succeeded()  # cooldown over, the probe worked
    h.prefill.error = None
    assert run(complete(h, LONG)).status_code == 200
    assert len(h.prefill.requests) == 2


def test_a_busy_prefill_pool_is_not_failed_over(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(prefill=FakePrefill(error=OverloadedError("at capacity", retry_after_s=1)))
    for _ in range(2):
        assert run(complete(h, LONG)).status_code == 200
    assert len(h.prefill.requests) == 2


def test_stalled_prefill_times_out_into_fallback(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(prefill=FakePrefill(delay_s=30.0), prefill_timeout_s=0.1)
    r = run(complete(h, LONG))
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "hello"
    assert decisions(h)[("local", "prefill_failed")] == 1.0


class AsgiStream:
    """Drives the ASGI app directly, recording every message it sends, in order."""

    def __init__(
        self, body: dict[str, Any], spec_version: str = "2.4", fail_body_sends_after: int = -1
    ) -> None:
        self.body = json.dumps(body).encode()
        self.spec_version = spec_version
        self.fail_body_sends_after = fail_body_sends_after  # then raise OSError: client gone
        self.sent: list[dict[str, Any]] = []
        self.disconnect = asyncio.Event()
        self._body_sent = False

    @property
    def body_text(self) -> str:
        return b"".join(m.get("body", b"") for m in self.sent).decode()

    async def receive(self) -> dict[str, Any]:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        num_bodies = sum(m["type"] == "http.response.body" for m in self.sent)
        if message["type"] == "http.response.body" and num_bodies == self.fail_body_sends_after:
            raise OSError("connection reset by peer")
        self.sent.append(message)

    async def __call__(self, app: Any) -> None:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": self.spec_version},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/completions",
            "raw_path": b"/v1/completions",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"content-type", b"application/json")],
            "client": ("127.0.0.1", 5000),
            "server": ("ingress", 80),
        }
        await app(scope, self.receive, self.send)


STREAM_BODY = {"model": MODEL, "prompt": LONG, "max_tokens": 3, "stream": True}


def test_first_token_is_sent_before_decode_starts(make_harness: Callable[..., Harness]) -> None:
    stream = AsgiStream(STREAM_BODY)
    sent_at_decode_start: list[str] = []

    def on_start(_: DecodeRequest) -> None:
        sent_at_decode_start.append(stream.body_text)

    h = make_harness(decode=FakeDecode(on_start=on_start))
    run(stream(h.app.asgi))
    (seen,) = sent_at_decode_start
    (first,) = sse_payloads(seen)  # exactly the prefill's token was on the wire already
    assert first["choices"][0]["text"] == "h"
    assert [p["choices"][0]["text"] for p in sse_payloads(stream.body_text)[:-1]] == [
        "h",
        "el",
        "lo",
    ]


def test_client_disconnect_closes_the_decode_stream(make_harness: Callable[..., Harness]) -> None:
    release = asyncio.Event()  # never set: decode would wait forever
    h = make_harness(decode=FakeDecode(release=release))
    stream = AsgiStream(STREAM_BODY, spec_version="2.3")  # starlette listens for disconnects

    async def scenario() -> int:
        task = asyncio.create_task(stream(h.app.asgi))
        await async_wait_until(lambda: len(h.decode.requests) == 1)
        stream.disconnect.set()
        await task
        return h.decode.num_closed  # before asyncio.run's shutdown could close a leak

    assert run(scenario()) == 1
    assert h.app.gate.num_in_flight == 0
    failed = h.app.metrics.registry.get_sample_value(
        "pdserve:requests_failed_total", {"reason": "client_disconnected"}
    )
    assert failed == 1.0


def test_failed_send_closes_the_decode_stream(make_harness: Callable[..., Harness]) -> None:
    """ASGI >= 2.4: a gone client makes ``send`` fail while decode waits at a yield."""
    h = make_harness(decode=FakeDecode(hang_after=1))
    stream = AsgiStream(STREAM_BODY, fail_body_sends_after=1)  # the prefill's token goes out

    async def scenario() -> int:
        with contextlib.suppress(ClientDisconnect):  # starlette's report of the failed send
            await stream(h.app.asgi)
        # NOTE: read before the loop runs again: the asyncgen finalizer (or asyncio.run's
        # shutdown) would close a leaked stream later and hide the leak.
        return h.decode.num_closed

    assert run(scenario()) == 1  # closed at once, not left to the garbage collector
    assert len(sse_payloads(stream.body_text)) == 1
    assert h.app.gate.num_in_flight == 0


def test_cancelled_request_task_closes_the_decode_stream(
    make_harness: Callable[..., Harness],
) -> None:
    """Ray Serve cancels the replica's task when the HTTP client goes away."""
    release = asyncio.Event()
    h = make_harness(decode=FakeDecode(release=release, hang_after=1))
    stream = AsgiStream(STREAM_BODY)

    async def scenario() -> int:
        task = asyncio.create_task(stream(h.app.asgi))
        await async_wait_until(lambda: len(h.decode.requests) == 1)
        release.set()  # one decode chunk, then it hangs
        await async_wait_until(lambda: stream.body_text.count("data:") == 2)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return h.decode.num_closed

    assert run(scenario()) == 1
    assert h.app.gate.num_in_flight == 0


def test_cancelled_non_streaming_request_closes_the_decode_stream(
    make_harness: Callable[..., Harness],
) -> None:
    h = make_harness(decode=FakeDecode(hang_after=1))
    body = {**STREAM_BODY, "stream": False}
    stream = AsgiStream(body)

    async def scenario() -> int:
        task = asyncio.create_task(stream(h.app.asgi))
        await async_wait_until(lambda: len(h.decode.requests) == 1)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return h.decode.num_closed

    assert run(scenario()) == 1
    assert h.app.gate.num_in_flight == 0
