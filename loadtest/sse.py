"""Incremental Server-Sent Events parser (the WHATWG event-stream format OpenAI servers use).

Bytes go in as they arrive from the socket, complete events come out. Lines end in ``\\n``,
``\\r\\n`` or ``\\r``; a blank line dispatches the event; ``:`` lines are comments (pings);
several ``data:`` lines join with ``\\n``; an ``event:`` line names the event (default
``message``). UTF-8 split across reads is handled by an incremental decoder.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(frozen=True)
class SSEEvent:
    """One dispatched event."""

    event: str
    data: str


class SSEParser:
    """Feed raw bytes, get the events completed by them."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume ``chunk``; return every event whose terminating blank line it contained."""
        self._buffer += self._decoder.decode(chunk)
        events: list[SSEEvent] = []
        while True:
            line, found = self._next_line()
            if not found:
                return events
            event = self._process_line(line)
            if event is not None:
                events.append(event)

    def _next_line(self) -> tuple[str, bool]:
        buf = self._buffer
        cut = min((i for i in (buf.find("\r"), buf.find("\n")) if i >= 0), default=-1)
        if cut < 0:
            return "", False
        if buf[cut] == "\r":
            if cut + 1 == len(buf):
                return "", False  # might be half of "\r\n": wait for the next byte
            end = cut + 2 if buf[cut + 1] == "\n" else cut + 1
        else:
            end = cut + 1
        self._buffer = buf[end:]
        return buf[:cut], True

    def _process_line(self, line: str) -> SSEEvent | None:
        if not line:
            if not self._data and not self._event:
                return None
            event = SSEEvent(event=self._event or "message", data="\n".join(self._data))
            self._event, self._data = "", []
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def close(self) -> list[SSEEvent]:
        """End of stream: dispatch a last event whose final blank line never came (lenient,
        as OpenAI clients are, so ``data: [DONE]`` without a trailing blank line still counts)."""
        rest = (self._buffer + self._decoder.decode(b"", final=True)).rstrip("\r")
        self._buffer = ""
        if rest:
            self._process_line(rest)
        last = self._process_line("")
        return [last] if last is not None else []
