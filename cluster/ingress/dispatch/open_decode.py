"""A decode call started ahead of its first token (the pipelined hand-off), and closing streams.

Closing a decode stream aborts its request on the replica and frees its blocks, so every path
that drops one (a finished request, a failed prefill, a migration) goes through :func:`close`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from cluster.ingress.dispatch.pool_clients import DecodeClient
from core.messages import DecodeRequest, TokenChunk


@dataclass
class OpenDecode:
    """A started decode call: its request, its stream, and the task already waiting for its
    first chunk (which sends the call)."""

    request: DecodeRequest
    stream: AsyncIterator[TokenChunk]
    first: asyncio.Future[TokenChunk]

    @classmethod
    def start(cls, decode: DecodeClient, request: DecodeRequest) -> OpenDecode:
        """Send ``request`` to the decode pool now."""
        stream = decode.generate(request)
        return cls(request, stream, asyncio.ensure_future(anext(stream)))


async def close(stream: AsyncIterator[TokenChunk]) -> None:
    """Close a decode stream (aborting the request upstream) if it can be closed."""
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        await aclose()


async def close_opened(opened: OpenDecode | None) -> None:
    """Abandon a started decode call: cancel its wait and close its stream (both sides free)."""
    if opened is None:
        return
    opened.first.cancel()
    with contextlib.suppress(BaseException):
        await opened.first
    await close(opened.stream)
