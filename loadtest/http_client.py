"""One streamed OpenAI request over httpx, timed the way ``vllm bench serve`` times it.

TTFT is the time from sending the request to the first SSE chunk carrying ``choices``; each
later such chunk adds one ITL gap (the time since the previous one); latency (E2EL) ends at the
last ``choices`` chunk. ``usage`` chunks (``stream_options.include_usage``) give the server's
token counts. A request succeeds only if the status is 200, no error event arrives, at least one
token chunk arrives and the stream ends with ``data: [DONE]``; anything else is a failure of one
``FailureKind``. The whole request is bounded by ``request_timeout_s``.

Request ids (``x-request-id``) are UUIDs, the one form every server takes: llama-cpp-python's
refuses any other with an empty 400. An error answer with an empty body is reported by its
status line and the headers worth showing, since that is all such a server says.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import httpx

from core.errors import UnavailableError
from loadtest.clock import now_s
from loadtest.config import LoadTestTargetConfig
from loadtest.server_timing import ServerTiming
from loadtest.sse import SSEEvent, SSEParser
from loadtest.types import FailureKind, StreamOutcome

Prompt = str | list[dict[str, str]]
_MAX_ERROR_CHARS = 500
_SHOWN_HEADERS = (
    "server", "content-type", "content-length", "retry-after", "www-authenticate", "via",
    "location",
)  # fmt: skip
"""Headers that say something about an error answer (no dates, cookies or echoed ids)."""


def new_request_id() -> str:
    """A fresh ``x-request-id``."""
    return str(uuid.uuid4())


def http_error_message(response: httpx.Response, body: bytes) -> str:
    """What a non-200 answer says: its error message, or, for an empty body, ``empty body``
    with the status line and the headers worth showing."""
    if body.strip():
        return error_message(body)
    status_line = f"{response.http_version} {response.status_code} {response.reason_phrase}"
    headers = response.headers
    shown = [f"{name}: {headers[name]}" for name in _SHOWN_HEADERS if name in headers]
    return "; ".join([f"empty body ({status_line.strip()})", *shown])[:_MAX_ERROR_CHARS]


def error_message(body: bytes | str) -> str:
    """The ``error.message`` of an OpenAI-shaped error body, else the body itself (trimmed)."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    try:
        payload = json.loads(text)
    except json.JSONDecodeError:
        return text.strip()[:_MAX_ERROR_CHARS]
    error = payload.get("error", payload) if isinstance(payload, dict) else payload
    if isinstance(error, dict):
        return str(error.get("message") or error)[:_MAX_ERROR_CHARS]
    return str(error)[:_MAX_ERROR_CHARS]


class _StreamState:
    """Folds SSE events into timings; ``failure`` ends the request early."""

    def __init__(self, start_s: float) -> None:
        self.start_s = start_s
        self.last_s = start_s
        self.ttft_s = 0.0
        self.itl_s: list[float] = []
        self.text_parts: list[str] = []
        self.num_chunks = 0
        self.usage_prompt: int | None = None
        self.usage_output: int | None = None
        self.server_timing: ServerTiming | None = None
        self.done = False
        self.headers_received = False
        self.failure: tuple[FailureKind, str, int | None] | None = None

    @property
    def finished(self) -> bool:
        return self.done or self.failure is not None

    def fail(self, kind: FailureKind, message: str, status: int | None = None) -> None:
        if self.failure is None:
            self.failure = (kind, message, status)

    def on_event(self, event: SSEEvent, now_s: float) -> None:
        if event.event == "error":
            self.fail(FailureKind.SSE_ERROR, error_message(event.data))
            return
        if event.data.strip() == "[DONE]":
            self.done = True
            return
        try:
            payload = json.loads(event.data)
        except json.JSONDecodeError:
            self.fail(FailureKind.INVALID, f"non-JSON SSE data: {event.data[:100]!r}")
            return
        if not isinstance(payload, dict):
            self.fail(FailureKind.INVALID, f"SSE data is not an object: {event.data[:100]!r}")
        elif payload.get("error"):
            self.fail(FailureKind.SSE_ERROR, error_message(json.dumps(payload)))
        else:
            self._on_chunk(payload, now_s)

    def _on_chunk(self, payload: dict[str, Any], now_s: float) -> None:
        choices = payload.get("choices")
        if choices:
            if self.num_chunks == 0:
                self.ttft_s = now_s - self.start_s
            else:
                self.itl_s.append(now_s - self.last_s)
            self.last_s = now_s
            self.num_chunks += 1
            choice = choices[0]
            delta = choice.get("delta") or {}
            self.text_parts.append(choice.get("text") or delta.get("content") or "")
        usage = payload.get("usage")
        if usage:
            self.usage_output = usage.get("completion_tokens")
            self.usage_prompt = usage.get("prompt_tokens")
            self.server_timing = ServerTiming.parse(usage) or self.server_timing

    def outcome(self) -> StreamOutcome:
        if self.failure is None and not self.done:
            self.fail(FailureKind.TRUNCATED, "stream ended without data: [DONE]")
        if self.failure is None and self.num_chunks == 0:
            self.fail(FailureKind.EMPTY, "[DONE] before any token chunk")
        kind, message, status = self.failure or (None, "", 200)
        return StreamOutcome(
            success=self.failure is None,
            start_time_s=self.start_s,
            ttft_s=self.ttft_s,
            itl_s=tuple(self.itl_s),
            latency_s=self.last_s - self.start_s,
            generated_text="".join(self.text_parts),
            num_token_chunks=self.num_chunks,
            usage_prompt_tokens=self.usage_prompt,
            usage_output_tokens=self.usage_output,
            failure_kind=kind,
            error=message,
            http_status=status,
            server_timing=self.server_timing,
        )


class OpenAIStreamClient:
    """Sends streamed completions / chat completions to one endpoint of one server."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        target: LoadTestTargetConfig,
        model: str,
        api_key: str | None = None,
    ) -> None:
        self._http = http
        self._target = target
        self._url = target.base_url.rstrip("/") + target.endpoint
        self._model = model
        self._api_key = api_key

    @property
    def chat(self) -> bool:
        """True when the endpoint is a chat-completions endpoint (messages, not a prompt)."""
        return self._target.endpoint.rstrip("/").endswith("chat/completions")

    def payload(self, prompt: Prompt, max_tokens: int) -> dict[str, Any]:
        """The JSON body for one request."""
        body: dict[str, Any] = {"model": self._model, "stream": True, "max_tokens": max_tokens}
        body["stream_options"] = {"include_usage": True}
        if self.chat:
            body["messages"] = prompt
            body["max_completion_tokens"] = max_tokens
        else:
            body["prompt"] = prompt
        if self._target.ignore_eos:
            body["ignore_eos"] = True
        if self._target.temperature is not None:
            body["temperature"] = self._target.temperature
        return body

    async def stream(self, prompt: Prompt, max_tokens: int, request_id: str) -> StreamOutcome:
        """Send one request and time its stream; never raises for server or network faults."""
        headers = {"x-request-id": request_id}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        state = _StreamState(now_s())
        try:
            async with asyncio.timeout(self._target.request_timeout_s):
                await self._exchange(self.payload(prompt, max_tokens), headers, state)
        except (TimeoutError, httpx.TimeoutException):
            state.fail(
                FailureKind.TIMEOUT, f"no complete answer in {self._target.request_timeout_s}s"
            )
        except (httpx.RemoteProtocolError, httpx.ReadError) as e:
            kind = FailureKind.TRUNCATED if state.headers_received else FailureKind.CONNECTION
            state.fail(kind, f"{type(e).__name__}: {e}")
        except httpx.HTTPError as e:
            state.fail(FailureKind.CONNECTION, f"{type(e).__name__}: {e}")
        return state.outcome()

    async def _exchange(
        self, body: dict[str, Any], headers: dict[str, str], state: _StreamState
    ) -> None:
        async with self._http.stream("POST", self._url, json=body, headers=headers) as response:
            if response.status_code != 200:
                message = http_error_message(response, await response.aread())
                state.fail(FailureKind.HTTP_STATUS, message, response.status_code)
                return
            state.headers_received = True
            parser = SSEParser()
            async for chunk in response.aiter_bytes():
                arrived_s = now_s()
                for event in parser.feed(chunk):
                    state.on_event(event, arrived_s)
                    if state.finished:
                        return
            for event in parser.close():
                state.on_event(event, now_s())


async def first_model(http: httpx.AsyncClient, base_url: str, api_key: str | None = None) -> str:
    """The id of the first model the server lists at ``/v1/models`` (vLLM bench's default)."""
    url = base_url.rstrip("/") + "/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = await http.get(url, headers=headers)
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        raise UnavailableError(f"cannot list models at {url} ({e}); pass --model") from e
