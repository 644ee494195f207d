"""What the ingress needs from the prefill and decode pools, as Protocols.

The Serve application adapts Ray Serve handles to these (plain data on the wire through
``core.codec``); unit tests pass in-process fakes or the real workers. The ingress never imports
Ray.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Protocol

from core.messages import (
    DecodeRequest,
    PrefillRequest,
    PrefillResult,
    PrefillStarted,
    TokenChunk,
)
from core.stats import ReplicaStats

StatsProvider = Callable[[], Awaitable[Mapping[str, Mapping[str, ReplicaStats]]]]
"""Returns the stats of every live replica by role (``"prefill"``, ``"decode"``) and replica id."""


class PrefillClient(Protocol):
    """The prefill pool, seen from the ingress."""

    async def prefill(self, request: PrefillRequest) -> PrefillResult:
        """Run the prompt on one prefill replica; the first token plus a KV handle.

        Raises a ``core.errors.PdserveError`` subclass on a typed failure; any other
        exception (a dead replica) is treated as the replica being unavailable.
        """
        ...

    def prefill_stream(
        self, request: PrefillRequest
    ) -> AsyncIterator[PrefillStarted | PrefillResult]:
        """The pipelined prefill: a :class:`PrefillStarted` (an export the decode can pull from
        at once), then the :class:`PrefillResult`. Raises as :meth:`prefill`; closing the
        iterator early aborts the prefill and frees its export."""
        ...

    def healthy(self) -> bool:
        """True when at least one prefill replica can serve now (cheap, never blocks)."""
        ...


class DecodeClient(Protocol):
    """The decode pool, seen from the ingress."""

    def generate(self, request: DecodeRequest) -> AsyncIterator[TokenChunk]:
        """Stream the request's tokens, one chunk per engine step.

        Closing the iterator early (``aclose()``) aborts the request on the replica and frees
        its blocks. A failure ends the stream with a chunk carrying its ``ErrorReport``.
        """
        ...

    def healthy(self) -> bool:
        """True when at least one decode replica can serve now (cheap, never blocks)."""
        ...
