"""Scripted fakes for the ingress tests: prefill and decode pool clients that record what the
ingress sent them and follow a script, the settings they run under, and the harness that binds
an app over them to an in-process httpx client.

The fakes stand in for the prefill and decode pools (the layer below the ingress), so protocol
details can be checked exactly.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import httpx

from cluster.ingress import IngressApp, IngressSettings
from core.codec import from_plain, to_plain
from core.config import DisaggregationConfig, RoutingConfig, ServerConfig
from core.errors import ErrorReport, PdserveError, TransferError
from core.kv_handle import KVHandle
from core.messages import (
    DecodeRequest,
    PrefillReply,
    PrefillRequest,
    PrefillResult,
    PrefillStarted,
    StageTimes,
    TokenChunk,
)

T = TypeVar("T")
MODEL = "tiny"
HANDLE = KVHandle(
    transfer_id="xfer-test",
    address="inproc://prefill-0",
    num_blocks=2,
    block_bytes=4096,
    layout_fingerprint="fp",
    lease_deadline_unix_ms=int(time.time() * 1000) + 60_000,
    exporter_epoch="epoch-1",
)
PIPELINED_HANDLE = replace(HANDLE, pipelined=True)


def run(coro: Coroutine[Any, Any, T], timeout_s: float = 10.0) -> T:
    """Run ``coro`` on a fresh event loop, failing the test if it takes over ``timeout_s``."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def sse_payloads(text: str) -> list[Any]:
    """The ``data:`` payloads of an SSE body, JSON-decoded except ``[DONE]``."""
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), events
    return [e[6:] if e[6:] == "[DONE]" else json.loads(e[6:]) for e in events]


M = TypeVar("M")


def over_the_wire(message: M) -> M:
    """``message`` after the trip a Serve call gives it: the codec, then JSON, and back."""
    return from_plain(type(message), json.loads(json.dumps(to_plain(message))))


@dataclass
class FakePrefill:
    """Returns a fixed first token and a KV handle, or fails with ``error``: a typed error
    comes back as a replica sends it (a ``PrefillReply`` through the codec and JSON), anything
    else is raised as it is (a dead replica)."""

    first_token_id: int = 104
    first_text: str = "h"
    num_cached_tokens: int = 16
    finish_reason: str | None = None
    error: BaseException | None = None
    is_healthy: bool = True
    delay_s: float = 0.0
    stage_times: StageTimes = field(default_factory=StageTimes)
    requests: list[PrefillRequest] = field(default_factory=list)
    error_after_start: BaseException | None = None
    """The pipelined prefill fails with this after it announced its export."""

    async def prefill(self, request: PrefillRequest) -> PrefillResult:
        self.requests.append(request)
        return await self._result(request)

    async def prefill_stream(
        self, request: PrefillRequest
    ) -> AsyncIterator[PrefillStarted | PrefillResult]:
        self.requests.append(request)
        if self.error is None:
            yield over_the_wire(PrefillStarted(request.request_id, PIPELINED_HANDLE))
        if self.error_after_start is not None:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            raise self.error_after_start
        yield await self._result(request)

    async def _result(self, request: PrefillRequest) -> PrefillResult:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if isinstance(self.error, PdserveError):
            return over_the_wire(PrefillReply(error=ErrorReport.of(self.error))).unwrap()
        if self.error is not None:
            raise self.error
        handle = None if self.finish_reason else HANDLE
        result = PrefillResult(
            request.request_id,
            self.first_token_id,
            self.first_text,
            self.num_cached_tokens,
            handle,
            self.finish_reason,
            stage_times=self.stage_times,
        )
        return over_the_wire(PrefillReply(result=result)).unwrap()

    def healthy(self) -> bool:
        return self.is_healthy


@dataclass
class FakeDecode:
    """Streams ``steps`` (token id, text) one chunk each; the last one finishes the request.

    A local-prefill request (no ``first_token_id``) gets ``local_steps`` instead. ``on_start``
    is called when ``generate`` is; ``release`` (when set) is awaited before the first chunk;
    ``fail_after`` ends the stream with an error chunk after that many chunks; ``raise_after``
    raises instead; ``hang_after`` blocks forever; ``end_early`` stops without finishing.
    """

    steps: list[tuple[int, str]] = field(default_factory=lambda: [(101, "el"), (108, "lo")])
    local_steps: list[tuple[int, str]] = field(
        default_factory=lambda: [(104, "h"), (101, "el"), (108, "lo")]
    )
    finish_reason: str = "length"
    num_cached_tokens: int = 0
    release: asyncio.Event | None = None
    fail_after: int | None = None
    raise_after: int | None = None
    hang_after: int | None = None
    end_early: bool = False
    is_healthy: bool = True
    on_start: Callable[[DecodeRequest], None] | None = None
    stage_times: StageTimes | None = None
    """Sent on the first chunk (a worker's queue/prefill or transfer/first-decode times)."""
    requests: list[DecodeRequest] = field(default_factory=list)
    num_closed: int = 0

    def generate(self, request: DecodeRequest) -> AsyncIterator[TokenChunk]:
        self.requests.append(request)
        if self.on_start is not None:
            self.on_start(request)
        return self._stream(request)

    async def _stream(self, request: DecodeRequest) -> AsyncIterator[TokenChunk]:
        try:
            if self.release is not None:
                await self.release.wait()
            steps = self.steps if request.kv_handle is not None else self.local_steps
            for i, (token_id, text) in enumerate(steps):
                if i == self.fail_after:
                    yield self._chunk(request, [], "", error=PULL_FAILED)
                    return
                if i == self.raise_after:
                    raise RuntimeError("decode replica died")
                if i == self.hang_after:
                    await asyncio.Event().wait()
                last = i == len(steps) - 1 and not self.end_early
                times = self.stage_times if i == 0 else None
                yield self._chunk(request, [token_id], text, finished=last, stage_times=times)
        finally:
            self.num_closed += 1

    def _chunk(
        self,
        request: DecodeRequest,
        token_ids: list[int],
        text: str,
        *,
        finished: bool = False,
        error: PdserveError | None = None,
        stage_times: StageTimes | None = None,
    ) -> TokenChunk:
        return over_the_wire(
            TokenChunk(
                request.request_id,
                token_ids,
                text,
                finished=finished or error is not None,
                finish_reason=self.finish_reason if finished else None,
                num_prompt_tokens=len(request.prompt_token_ids),
                num_cached_tokens=self.num_cached_tokens,
                error=None if error is None else ErrorReport.of(error),
                stage_times=stage_times,
            )
        )

    def healthy(self) -> bool:
        return self.is_healthy


PULL_FAILED = TransferError("pull failed", reason="exporter_error", param="kv_handle")
"""The error a ``FakeDecode(fail_after=n)`` stream ends with."""

BASE_SETTINGS = IngressSettings(
    served_model_names=(MODEL,),
    max_model_len=256,
    block_size=4,
    hash_seed=0,
    server=ServerConfig(prefill_timeout_s=2.0, chunk_timeout_s=2.0),
    disaggregation=DisaggregationConfig(local_prefill_threshold_tokens=8),
)


def settings_with(**overrides: Any) -> IngressSettings:
    """``BASE_SETTINGS`` with ``overrides``; server, routing and disaggregation fields go to
    their section."""
    server = {k: v for k, v in overrides.items() if k in ServerConfig.model_fields}
    routing = {k: v for k, v in overrides.items() if k in RoutingConfig.model_fields}
    disagg = {k: v for k, v in overrides.items() if k in DisaggregationConfig.model_fields}
    rest = {k: v for k, v in overrides.items() if k not in {*server, *routing, *disagg}}
    return replace(
        BASE_SETTINGS,
        server=BASE_SETTINGS.server.model_copy(update=server),
        routing=BASE_SETTINGS.routing.model_copy(update=routing),
        disaggregation=BASE_SETTINGS.disaggregation.model_copy(update=disagg),
        **rest,
    )


@dataclass
class Harness:
    """An app over fakes, and an httpx client bound to it in-process."""

    app: IngressApp
    prefill: FakePrefill
    decode: FakeDecode

    def client(self, **headers: str) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=self.app.asgi)
        return httpx.AsyncClient(transport=transport, base_url="http://ingress", headers=headers)
