"""Serve handles adapted to the ingress's ``PrefillClient`` / ``DecodeClient`` protocols.

Dicts cross the Serve boundary (``to_dict`` / ``from_dict`` at each end); a prefill replica's
``{"error": ...}`` reply is re-raised as the same ``core.errors`` class. Serve's own failures
are translated: backpressure (``max_queued_requests``) -> ``OverloadedError`` (429), a dead or
missing replica -> ``UnavailableError`` (the ingress then prefills locally or fails cleanly).
Pool health comes from the :class:`PoolWatch`, which mirrors the stats board: a pool is healthy
while at least one of its replicas reports.

Routing keys: both clients send ``{**request.to_dict(), "block_hashes": ..., "session_id": ...}``
(:class:`RoutingKeys`), what the pools' request routers read (``cluster.routing``). The hashes
are the engines' chained block hashes of the prompt; the session id is the one the ingress's
middleware put in :data:`CURRENT_SESSION_ID` for the request being served.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from ray.exceptions import RayActorError
from ray.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaUnavailableError,
)
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from cluster.routing.request_features import BLOCK_HASHES_KEY, SESSION_ID_KEY
from core import errors
from core.errors import OverloadedError, PdserveError, UnavailableError
from core.hashing import hash_prompt_blocks
from core.messages import DecodeRequest, PrefillRequest, PrefillResult, TokenChunk

logger = logging.getLogger(__name__)

_SERVE_UNAVAILABLE = (RayActorError, DeploymentUnavailableError, ReplicaUnavailableError)

CURRENT_SESSION_ID: ContextVar[str | None] = ContextVar("pdserve_session_id", default=None)
"""The session id of the HTTP request being served (set by the ingress's middleware)."""


@dataclass(frozen=True)
class RoutingKeys:
    """Adds the routers' keys to a request dict (same block size and seed as the engines)."""

    block_size: int
    hash_seed: int = 0

    def payload(self, request: dict[str, Any], prompt_ids: Sequence[int]) -> dict[str, Any]:
        """``request`` plus its prompt's ``block_hashes`` and the current ``session_id``."""
        hashes = hash_prompt_blocks(prompt_ids, self.block_size, seed=self.hash_seed)
        return {**request, BLOCK_HASHES_KEY: hashes, SESSION_ID_KEY: CURRENT_SESSION_ID.get()}


def error_from_dict(data: Mapping[str, Any]) -> PdserveError:
    """Rebuild the typed error a role deployment reported (``error_to_dict``)."""
    cls = getattr(errors, str(data.get("class")), None)
    message = str(data.get("message", "worker error"))
    param = data.get("param")
    if not (isinstance(cls, type) and issubclass(cls, PdserveError)):
        return PdserveError(message, param=param)
    if issubclass(cls, errors.TransferError):
        return cls(message, reason=str(data.get("reason") or "internal"), param=param)
    if issubclass(cls, OverloadedError):
        return cls(message, retry_after_s=float(data.get("retry_after_s") or 1.0))
    return cls(message, param=param)


class PoolWatch:
    """How many replicas of each role reported to the stats board lately (refreshed in the
    background, so ``healthy()`` never blocks)."""

    def __init__(self, board: DeploymentHandle, refresh_s: float = 0.5) -> None:
        self._board = board
        self._refresh_s = refresh_s
        self._num_live: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin refreshing on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._refresh_forever())

    def stop(self) -> None:
        """Stop refreshing."""
        if self._task is not None:
            self._task.cancel()

    def num_live(self, role: str) -> int:
        """Replicas of ``role`` that reported within the board's staleness bound."""
        return self._num_live.get(role, 0)

    async def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        """The board's current reports by role (also refreshes the live counts)."""
        reports: dict[str, list[dict[str, Any]]] = await self._board.snapshot.remote()
        self._num_live = {role: len(replicas) for role, replicas in reports.items()}
        return reports

    async def stats_by_role(self) -> dict[str, list[dict[str, Any]]]:
        """``role -> [stats() of each live replica]`` (the ingress's ``StatsProvider``)."""
        reports = await self.snapshot()
        return {role: [r["stats"] for r in replicas] for role, replicas in reports.items()}

    async def _refresh_forever(self) -> None:
        while True:
            try:
                await self.snapshot()
            except Exception as e:  # keep the last counts; the board may be restarting
                logger.warning("stats board unavailable: %s: %s", type(e).__name__, e)
            await asyncio.sleep(self._refresh_s)


class ServePrefillClient:
    """``PrefillClient`` over the Prefill deployment's handle."""

    def __init__(self, handle: DeploymentHandle, watch: PoolWatch, keys: RoutingKeys) -> None:
        self._prefill = handle.options(method_name="prefill")
        self._watch = watch
        self._keys = keys

    async def prefill(self, request: PrefillRequest) -> PrefillResult:
        """Run the prompt on one prefill replica (see the module docstring for errors)."""
        try:
            payload = self._keys.payload(request.to_dict(), request.prompt_token_ids)
            reply: dict[str, Any] = await self._prefill.remote(payload)
        except BackPressureError as e:
            raise OverloadedError(f"prefill pool is at capacity: {e}") from e
        except _SERVE_UNAVAILABLE as e:
            raise UnavailableError(f"prefill replica unavailable: {type(e).__name__}") from e
        if "error" in reply:
            raise error_from_dict(reply["error"])
        return PrefillResult.from_dict(reply["result"])

    def healthy(self) -> bool:
        """True while at least one prefill replica reports to the board."""
        return self._watch.num_live("prefill") > 0


class NoPrefillPool:
    """``PrefillClient`` of an app without a prefill pool: never healthy, so every request
    prefills locally on decode."""

    async def prefill(self, request: PrefillRequest) -> PrefillResult:
        """Always unavailable."""
        raise UnavailableError(f"request {request.request_id}: this app has no prefill pool")

    def healthy(self) -> bool:
        """Always False."""
        return False


class ServeDecodeClient:
    """``DecodeClient`` over the Decode deployment's streaming handle."""

    def __init__(self, handle: DeploymentHandle, watch: PoolWatch, keys: RoutingKeys) -> None:
        self._generate = handle.options(method_name="generate", stream=True)
        self._watch = watch
        self._keys = keys

    async def generate(self, request: DecodeRequest) -> AsyncIterator[TokenChunk]:
        """Stream the request's chunks; closing this iterator cancels the replica's stream."""
        stream = self._generate.remote(
            self._keys.payload(request.to_dict(), request.prompt_token_ids)
        )
        assert isinstance(stream, DeploymentResponseGenerator)  # stream=True handle
        try:
            async for data in stream:
                yield TokenChunk.from_dict(data)
        except BackPressureError as e:
            raise OverloadedError(f"decode pool is at capacity: {e}") from e
        except _SERVE_UNAVAILABLE as e:
            raise UnavailableError(f"decode replica unavailable: {type(e).__name__}") from e
        finally:
            stream.cancel()  # no-op once the stream finished; aborts the request otherwise

    def healthy(self) -> bool:
        """True while at least one decode replica reports to the board."""
        return self._watch.num_live("decode") > 0
