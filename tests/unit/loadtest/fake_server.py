"""A fake OpenAI server on 127.0.0.1 with exact timing and injected faults, for load-test tests.

It runs a raw asyncio HTTP/1.1 server in its own thread (its own event loop), so the load
tester's timings are taken against an independent clock-driven peer: the first token is sent
``ttft_s`` after the request arrived and token ``k`` at ``ttft_s + k * itl_s`` (absolute
deadlines, no drift). Streams use chunked encoding like uvicorn. ``faults`` maps the arrival
index of a request (0-based) to a fault; every request is recorded with its arrival time.
Token counts (usage, ``/tokenize`` when served) are ``tokens_of(text)`` plus ``bos_tokens``;
calibration probes (``max_tokens: 1``) are answered but kept apart in ``probes`` so they take no
fault index. With ``uuid_request_ids`` it refuses a request whose ``x-request-id`` is not a UUID
with an empty 400, as llama-cpp-python's server does; such a refusal takes no index either.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FAULTS = (
    "http_500",
    "http_429",
    "sse_error",
    "sse_error_event",
    "truncate",
    "drop",
    "stall",
    "garbage",
    "empty",
)


@dataclass
class FakeBehaviour:
    """How the fake server answers."""

    ttft_s: float = 0.05
    itl_s: float = 0.01
    faults: dict[int, str] = field(default_factory=dict)
    ttft_overrides_s: dict[int, float] = field(default_factory=dict)
    include_usage: bool = True
    model: str = "fake-model"
    max_model_len: int | None = None
    serves_tokenize: bool = False
    tokens_of: Callable[[str], int] = field(default=lambda text: len(text.split()))
    bos_tokens: int = 0
    ttft_breakdown: dict[str, Any] | None = None
    """Sent in ``usage`` as pdserve does."""
    uuid_request_ids: bool = False
    """Refuse an ``x-request-id`` that is not a UUID (an empty 400), as llama-cpp-python does."""
    metrics_text: Callable[[], str] | None = None
    """``GET /metrics`` answers this Prometheus text (None: 404, as a server without it)."""


@dataclass(frozen=True)
class Received:
    """One request as the server saw it."""

    index: int
    arrival_s: float  # the serving loop's clock at arrival (the client's, on one loop)
    path: str
    body: dict[str, Any]

    @property
    def prompt_text(self) -> str:
        if "messages" in self.body:
            return "".join(m["content"] for m in self.body["messages"])
        return str(self.body.get("prompt", ""))


class FakeOpenAIServer:
    """Listens from construction (``url``); serves either in its own thread (``start()``) or on
    the caller's event loop (``await serve()``, e.g. a virtual-time loop shared with the client);
    ``stop()`` / ``await close()`` end everything."""

    def __init__(self, behaviour: FakeBehaviour) -> None:
        self.behaviour = behaviour
        self.received: list[Received] = []
        self.probes: list[Received] = []
        self.refused_request_ids: list[str] = []
        self.num_tokenize_calls = 0
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = threading.Lock()

    def start(self) -> str:
        """Serve in a thread of its own (a real-time loop); returns the base URL."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.serve(), self._loop).result(timeout=5)
        return self.url

    async def serve(self) -> None:
        """Start serving on the running loop."""
        self._server = await asyncio.start_server(self._handle, sock=self._socket)

    async def close(self) -> None:
        """Stop serving on the running loop: the listener, then every open stream."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def stop(self) -> None:
        """End the thread-mode server (or just the socket of one never served)."""
        if self._loop is None or self._thread is None:
            self._socket.close()
            return
        asyncio.run_coroutine_threadsafe(self.close(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)  # type: ignore[arg-type]
        try:
            await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._tasks.discard(task)  # type: ignore[arg-type]
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        arrival_s = asyncio.get_running_loop().time()
        lines = head.decode().split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {
            k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)
        }
        body_bytes = await reader.readexactly(int(headers.get("content-length", "0")))
        if method == "GET" and path == "/v1/models":
            model: dict[str, Any] = {"id": self.behaviour.model, "object": "model"}
            if self.behaviour.max_model_len is not None:
                model["max_model_len"] = self.behaviour.max_model_len
            await self._send_json(writer, 200, {"object": "list", "data": [model]})
            return
        if method == "GET" and path == "/metrics":
            await self._metrics(writer)
            return
        body = json.loads(body_bytes or b"{}")
        if path == "/tokenize":
            await self._tokenize(writer, body)
            return
        if self.behaviour.uuid_request_ids and not _is_uuid(headers.get("x-request-id")):
            with self._lock:
                self.refused_request_ids.append(headers.get("x-request-id", ""))
            await self._send_empty_400(writer)
            return
        if body.get("max_tokens") == 1:
            with self._lock:
                self.probes.append(Received(len(self.probes), arrival_s, path, body))
            await self._complete(writer, -1, body, path.endswith("chat/completions"))
            return
        with self._lock:
            index = len(self.received)
            self.received.append(Received(index, arrival_s, path, body))
        await self._complete(writer, index, body, path.endswith("chat/completions"))

    async def _tokenize(self, writer: asyncio.StreamWriter, body: dict[str, Any]) -> None:
        with self._lock:
            self.num_tokenize_calls += 1
        if not self.behaviour.serves_tokenize:
            await self._send_json(writer, 404, {"detail": "Not Found"})
            return
        special = body.get("add_special_tokens", "messages" not in body)
        text = Received(0, 0.0, "", body).prompt_text
        count = self.behaviour.tokens_of(text) + (self.behaviour.bos_tokens if special else 0)
        if "messages" in body:
            count += 5  # a chat template's role markers
        data = {"count": count, "max_model_len": self.behaviour.max_model_len, "tokens": []}
        await self._send_json(writer, 200, data)

    async def _metrics(self, writer: asyncio.StreamWriter) -> None:
        if self.behaviour.metrics_text is None:
            await self._send_json(writer, 404, {"detail": "Not Found"})
            return
        payload = self.behaviour.metrics_text().encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
            + f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
            + payload
        )
        await writer.drain()

    async def _send_json(self, writer: asyncio.StreamWriter, status: int, data: Any) -> None:
        payload = json.dumps(data).encode()
        reason = {
            200: "OK",
            400: "Bad Request",
            404: "Not Found",
            429: "Too Many Requests",
            500: "Internal Server Error",
        }[status]
        extra = "Retry-After: 1\r\n" if status == 429 else ""
        writer.write(
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
            + payload
        )
        await writer.drain()

    @staticmethod
    async def _send_empty_400(writer: asyncio.StreamWriter) -> None:
        """starlette-context's refusal under uvicorn: a status line, no body."""
        writer.write(
            b"HTTP/1.1 400 Bad Request\r\ndate: Fri, 28 Nov 2026 00:00:00 GMT\r\n"
            b"server: uvicorn\r\ncontent-length: 0\r\nConnection: close\r\n\r\n"
        )
        await writer.drain()

    @staticmethod
    def _chunk(writer: asyncio.StreamWriter, text: str) -> None:
        data = text.encode()
        writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def _token_event(self, chat: bool, i: int) -> str:
        if chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": f" t{i}"}}
        else:
            choice = {"index": 0, "text": f" t{i}", "finish_reason": None}
        return f"data: {json.dumps({'id': 'x', 'choices': [choice]})}\n\n"

    def _too_long(self, body: dict[str, Any]) -> str | None:
        """pdserve's 400 message when prompt + max_tokens exceed ``max_model_len``."""
        limit = self.behaviour.max_model_len
        if limit is None:
            return None
        prompt = self.behaviour.tokens_of(Received(0, 0.0, "", body).prompt_text)
        prompt += self.behaviour.bos_tokens
        wanted = int(body.get("max_tokens") or 16)
        if prompt + wanted <= limit:
            return None
        return (
            f"this model's maximum context length is {limit} tokens; you requested "
            f"{prompt + wanted} tokens ({prompt} in the prompt, {wanted} in the completion)"
        )

    async def _complete(
        self, writer: asyncio.StreamWriter, index: int, body: dict[str, Any], chat: bool
    ) -> None:
        too_long = self._too_long(body)
        if too_long is not None:
            await self._send_json(writer, 400, {"error": {"message": too_long, "code": 400}})
            return
        fault = self.behaviour.faults.get(index)
        if fault in ("http_500", "http_429"):
            status = 500 if fault == "http_500" else 429
            await self._send_json(writer, status, {"error": {"message": f"injected {fault}"}})
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        await writer.drain()
        if fault == "stall":
            await asyncio.sleep(30)
            return
        num_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if fault in ("sse_error", "sse_error_event", "truncate", "drop", "garbage"):
            num_tokens = min(num_tokens, 2)
        if fault == "empty":
            num_tokens = 0
        ttft_s = self.behaviour.ttft_overrides_s.get(index, self.behaviour.ttft_s)
        start = asyncio.get_running_loop().time()
        for i in range(num_tokens):
            delay = start + ttft_s + i * self.behaviour.itl_s - asyncio.get_running_loop().time()
            await asyncio.sleep(max(0.0, delay))
            self._chunk(writer, self._token_event(chat, i))
            await writer.drain()
        await self._finish(writer, fault, body, num_tokens)

    async def _finish(
        self, writer: asyncio.StreamWriter, fault: str | None, body: dict[str, Any], n: int
    ) -> None:
        if fault == "drop":
            writer.transport.abort()
            return
        if fault == "sse_error":
            self._chunk(writer, 'data: {"error": {"message": "injected mid-stream error"}}\n\n')
        elif fault == "sse_error_event":
            self._chunk(writer, 'event: error\ndata: {"error": {"message": "boom"}}\n\n')
        elif fault == "garbage":
            self._chunk(writer, "data: this is not json\n\n")
        if self.behaviour.include_usage and fault is None:
            prompt = Received(0, 0.0, "", body).prompt_text
            prompt_tokens = self.behaviour.tokens_of(prompt) + self.behaviour.bos_tokens
            usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": n}
            if self.behaviour.ttft_breakdown is not None:
                usage["ttft_breakdown"] = self.behaviour.ttft_breakdown
            self._chunk(writer, f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n")
        if fault != "truncate":
            self._chunk(writer, "data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def _is_uuid(value: str | None) -> bool:
    try:
        uuid.UUID(value or "")
    except ValueError:
        return False
    return True
