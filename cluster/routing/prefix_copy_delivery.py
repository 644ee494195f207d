"""Delivering the hot-prefix copies a router decided: ask the holder to export the blocks, then
the target to pull them, off the user requests' path.

:meth:`PrefixCopyDelivery.submit` starts one background task per
:class:`~core.messages.WarmPrefixRequest` on the router's event loop and returns at once — no
user request ever waits on a copy. The task calls the holder's ``export_prefix`` and then the
target's ``warm_prefix`` through a :class:`ReplicaCaller` (Serve handles pinned to one replica
each, ``cluster.routing.serve_prefix_caller``; fakes in tests), within ``timeout_s`` in all, and
reports a :class:`CopyOutcome`: the bytes that really moved, or why the copy failed. At most
``max_in_flight`` copies run at once; one more is reported failed at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from core.messages import PrefixExport, WarmPrefixRequest
from replica.prefix_warming import WarmPrefixResult

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CopyOutcome:
    """What one delivered copy came to."""

    num_blocks: int = 0  # blocks the target admitted
    num_bytes: int = 0  # KV bytes that moved into the target
    failure: str | None = None  # None: every requested block landed

    @property
    def landed(self) -> bool:
        """True when at least one block reached the target."""
        return self.num_blocks > 0


class ReplicaCaller(Protocol):
    """Calls one named replica of the router's pool."""

    async def export_prefix(self, request: WarmPrefixRequest) -> PrefixExport | None:
        """``request.source_replica_id`` exports what it caches of the prefix (None: none)."""
        ...

    async def warm_prefix(
        self, request: WarmPrefixRequest, export: PrefixExport
    ) -> WarmPrefixResult:
        """``request.target_replica_id`` pulls ``export`` into its host tier."""
        ...


OnOutcome = Callable[[WarmPrefixRequest, CopyOutcome], None]


class PrefixCopyDelivery:
    """Runs decided copies in the background and reports each one's outcome."""

    def __init__(
        self,
        caller: ReplicaCaller,
        on_outcome: OnOutcome,
        *,
        timeout_s: float,
        max_in_flight: int = 4,
    ) -> None:
        self._caller = caller
        self._on_outcome = on_outcome
        self.timeout_s = timeout_s
        self.max_in_flight = max_in_flight
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def num_in_flight(self) -> int:
        """Copies running now."""
        return len(self._tasks)

    def submit(self, request: WarmPrefixRequest) -> None:
        """Start delivering ``request`` on the running loop (returns at once)."""
        if len(self._tasks) >= self.max_in_flight:
            self._report(request, CopyOutcome(failure="too many copies in flight"))
            return
        task = asyncio.get_running_loop().create_task(self._run(request))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait_idle(self) -> None:
        """Until every copy started so far has ended (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks))

    async def _run(self, request: WarmPrefixRequest) -> None:
        try:
            outcome = await asyncio.wait_for(self.deliver(request), self.timeout_s)
        except TimeoutError:
            outcome = CopyOutcome(failure=f"no answer within {self.timeout_s:g}s")
        except Exception as e:  # a replica died, refused, or the call broke: the copy failed
            outcome = CopyOutcome(failure=f"{type(e).__name__}: {e}")
        self._report(request, outcome)

    async def deliver(self, request: WarmPrefixRequest) -> CopyOutcome:
        """Export on the holder, then pull on the target (exceptions propagate)."""
        export = await self._caller.export_prefix(request)
        if export is None:
            return CopyOutcome(failure="the holder no longer caches the prefix")
        result = await self._caller.warm_prefix(request, export)
        return CopyOutcome(result.num_blocks_admitted, result.num_bytes, result.failure)

    def _report(self, request: WarmPrefixRequest, outcome: CopyOutcome) -> None:
        if outcome.failure is not None:
            logger.info(
                "copy of prefix %s from %s to %s: %s",
                request.prefix_head,
                request.source_replica_id,
                request.target_replica_id,
                outcome.failure,
            )
        try:
            self._on_outcome(request, outcome)
        except Exception:  # a counting bug must not kill the loop's task silently
            logger.exception("recording the outcome of a prefix copy failed")
