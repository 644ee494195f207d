"""Serve handles adapted to the ingress's ``PrefillClient`` / ``DecodeClient`` protocols.

Typed messages cross the Serve boundary as plain data through ``core.codec`` (``to_plain`` here,
``from_plain`` in the replica, and back); a prefill replica's ``PrefillReply.error`` is re-raised
as the same ``core.errors`` class. Each request already carries its ``RoutingKeys`` (computed
once by the ingress), which the pools' request routers read. Serve's own failures are translated:
backpressure (``max_queued_requests``) -> ``OverloadedError`` (429), a dead or missing replica ->
``UnavailableError`` (the ingress then prefills locally or fails cleanly). Pool health comes from
the :class:`PoolWatch`, which mirrors the stats board: a pool is healthy while at least one of
its replicas reports. The watch also asks a decode replica Serve is stopping to hand its streams
off (``cluster.serve.leaving_replicas``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ray.exceptions import RayActorError
from ray.serve import context as serve_context
from ray.serve._private.utils import generate_request_id
from ray.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaUnavailableError,
)
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from cluster.routing import board_fingerprints, routed_replicas
from cluster.serve.leaving_replicas import LeavingDecodes
from cluster.serve.stats_board import decode_reports
from core.codec import from_plain, to_plain
from core.errors import OverloadedError, UnavailableError
from core.messages import (
    DecodeRequest,
    PrefillReply,
    PrefillRequest,
    PrefillResult,
    PrefillStarted,
    PrefillUpdate,
    TokenChunk,
)
from core.stats import ReplicaReport, ReplicaStats

logger = logging.getLogger(__name__)

_SERVE_UNAVAILABLE = (RayActorError, DeploymentUnavailableError, ReplicaUnavailableError)


@contextlib.contextmanager
def _own_call_id() -> Iterator[None]:
    """A handle call made inside this block gets an internal request id of its own.

    NOTE: Serve gives a handle call the internal id of the HTTP request it serves, and its
    request router indexes the calls it is placing by that id (Ray 2.60,
    ``RequestRouter._add_pending_request_to_indices``): two calls of one request in flight at
    once (``n`` > 1, a batch of prompts) collide there, and one of them is never placed. Our
    own code cancels each call it abandons, so nothing relies on Serve's cascade by parent id.
    """
    current = serve_context._get_serve_request_context()
    fresh = dataclasses.replace(current, _internal_request_id=generate_request_id())
    token = serve_context._serve_request_context.set(fresh)  # type: ignore[arg-type]
    try:
        yield
    finally:
        serve_context._serve_request_context.reset(token)


class PoolWatch:
    """How many replicas of each pool (``core.config.pool_key``) reported to the stats board
    lately (refreshed in the background, so ``healthy()`` never blocks)."""

    def __init__(self, board: DeploymentHandle, refresh_s: float = 0.5) -> None:
        self._board = board
        self._refresh_s = refresh_s
        self._reports: dict[str, list[ReplicaReport]] = {}
        self._live: dict[str, list[ReplicaReport]] = {}
        self._cordoned: frozenset[tuple[str, str]] = frozenset()
        self._reports_seq = 0
        self._counted: tuple[int, int] | None = None
        self._num_live: dict[str, int] = {}
        self._fingerprints: dict[str, dict[str, int]] = {}
        self._fingerprint_apps: dict[str, dict[str, Counter[str]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._epoch: str | None = None
        self.unavailable_total = 0
        """Refreshes that found the board unreachable (the last counts were kept)."""
        self.restarts_total = 0
        """Times the board answered as a new instance (Serve replaced it)."""
        self.leaving = LeavingDecodes(self._ask_hand_off)
        """Asks decode replicas Serve is stopping to hand their streams off."""

    def start(self) -> None:
        """Begin refreshing on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._refresh_forever())

    def stop(self) -> None:
        """Stop refreshing."""
        if self._task is not None:
            self._task.cancel()

    async def _ask_hand_off(self, replica_id: str) -> None:
        await self._board.hand_off_replica.remote(replica_id)

    def num_live(self, pool: str) -> int:
        """Replicas of ``pool`` that reported within the board's staleness bound."""
        self._recount()
        return self._num_live.get(pool, 0)

    def fingerprints(self, pool: str) -> dict[str, int]:
        """Live replicas of ``pool`` by KV fingerprint (``ReplicaStats.kv_fingerprint``)."""
        self._recount()
        return self._fingerprints.get(pool, {})

    def app_of(self, pool: str, fingerprint: str) -> str | None:
        """A Serve app whose live replicas of ``pool`` run ``fingerprint`` (a stepped rollout's
        two versions run in two apps), drawn by their count when both do (a change that keeps
        the fingerprint); None when none reports it."""
        self._recount()
        apps = self._fingerprint_apps.get(pool, {}).get(fingerprint)
        if not apps:
            return None
        names = sorted(apps)
        return names[0] if len(names) == 1 else random.choices(names, [apps[n] for n in names])[0]

    async def snapshot(self) -> dict[str, list[ReplicaReport]]:
        """The board's current reports by role, of the replicas a request can be placed on
        (held by this process's routers: ``cluster.routing.routed_replicas``; not of a
        cordoned pool: ``StatsBoard.cordon``); the live counts follow."""
        view: dict[str, Any] = await self._board.view.remote()
        if self._epoch is not None and view["epoch"] != self._epoch:
            self.restarts_total += 1
            logger.warning("stats board restarted: its reports refill as replicas post")
        self._epoch = view["epoch"]
        self._reports = decode_reports(view["pools"])
        board_fingerprints.publish(
            {r.replica_id: r.stats.kv_fingerprint for rs in self._reports.values() for r in rs}
        )
        self._cordoned = frozenset((app, name) for app, name in view.get("cordoned", ()))
        self._reports_seq += 1
        self._recount()
        return self._live

    async def refresh(self) -> None:
        """One background refresh: :meth:`snapshot`, then ask the decode replicas Serve is
        stopping for their handoffs (here, not in ``snapshot``, which ``/metrics`` calls too)."""
        await self.snapshot()
        await self.leaving.check(self._reports, self._fingerprints)

    def _recount(self) -> None:
        """Count again when the board or a router's replica set changed since the last count
        (a router drops a stopped replica at once, not at the next board refresh)."""
        key = (self._reports_seq, routed_replicas.version())
        if key == self._counted:
            return
        self._counted = key
        self._live, self._fingerprint_apps = {}, {}
        for role, replicas in self._reports.items():
            live = self._live.setdefault(role, [])
            apps = self._fingerprint_apps.setdefault(role, {})
            for r in replicas:
                deployment = routed_replicas.deployment_of(r.actor_name)
                if deployment in self._cordoned:
                    continue
                if not routed_replicas.routable(deployment, r.replica_id):
                    continue
                live.append(r)
                if deployment is not None:
                    apps.setdefault(r.stats.kv_fingerprint, Counter())[deployment[0]] += 1
        self._num_live = {role: len(replicas) for role, replicas in self._live.items()}
        self._fingerprints = {
            role: dict(Counter(r.stats.kv_fingerprint for r in replicas))
            for role, replicas in self._live.items()
        }

    async def stats_by_role(self) -> dict[str, dict[str, ReplicaStats]]:
        """``role -> replica id -> stats`` of each live replica (the ingress's
        ``StatsProvider``)."""
        reports = await self.snapshot()
        return {
            role: {r.replica_id: r.stats for r in replicas} for role, replicas in reports.items()
        }

    async def _refresh_forever(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as e:  # keep the last counts; the board may be restarting
                self.unavailable_total += 1
                logger.warning("stats board unavailable: %s: %s", type(e).__name__, e)
            await asyncio.sleep(self._refresh_s)


class PoolVersions:
    """``FleetVersions`` of one model's two pools, from the stats board (never blocks)."""

    def __init__(self, watch: PoolWatch, prefill_pool: str, decode_pool: str) -> None:
        self._watch = watch
        self._prefill_pool = prefill_pool
        self._decode_pool = decode_pool

    def decode_fingerprints(self) -> dict[str, int]:
        """Live decode replicas by fingerprint."""
        return self._watch.fingerprints(self._decode_pool)

    def prefill_fingerprints(self) -> dict[str, int]:
        """Live prefill replicas by fingerprint."""
        return self._watch.fingerprints(self._prefill_pool)


class ServePrefillClient:
    """``PrefillClient`` over the Prefill deployment's handle."""

    def __init__(self, handle: DeploymentHandle, watch: PoolWatch, pool: str = "prefill") -> None:
        self._prefill = handle.options(method_name="prefill")
        self._prefill_stream = handle.options(method_name="prefill_stream", stream=True)
        self._watch = watch
        self._pool = pool

    async def prefill(self, request: PrefillRequest) -> PrefillResult:
        """Run the prompt on one prefill replica (see the module docstring for errors).

        Cancelling this call (an ingress timeout, a client that left) cancels the Serve call, so
        the replica aborts the request and frees its blocks instead of computing and pinning
        the prompt for nobody."""
        with _own_call_id():
            response = self._prefill.remote(to_plain(request))
        try:
            plain: dict[str, Any] = await response
        except asyncio.CancelledError:
            response.cancel()
            logger.info("request %s: prefill call cancelled on its replica", request.request_id)
            raise
        except BackPressureError as e:
            raise OverloadedError(f"prefill pool is at capacity: {e}") from e
        except _SERVE_UNAVAILABLE as e:
            raise UnavailableError(f"prefill replica unavailable: {type(e).__name__}") from e
        return from_plain(PrefillReply, plain).unwrap()

    async def prefill_stream(
        self, request: PrefillRequest
    ) -> AsyncIterator[PrefillStarted | PrefillResult]:
        """The pipelined prefill on one replica (errors as :meth:`prefill`); closing this
        iterator cancels the replica's stream, which aborts the prefill and frees its export."""
        with _own_call_id():
            stream = self._prefill_stream.remote(to_plain(request))
        assert isinstance(stream, DeploymentResponseGenerator)  # stream=True handle
        try:
            async for data in stream:
                update: PrefillUpdate = from_plain(PrefillUpdate, data)  # type: ignore[arg-type]
                yield update if isinstance(update, PrefillStarted) else update.unwrap()
        except BackPressureError as e:
            raise OverloadedError(f"prefill pool is at capacity: {e}") from e
        except _SERVE_UNAVAILABLE as e:
            raise UnavailableError(f"prefill replica unavailable: {type(e).__name__}") from e
        finally:
            stream.cancel()  # no-op once the stream finished; aborts the prefill otherwise

    def healthy(self) -> bool:
        """True while at least one prefill replica reports to the board."""
        return self._watch.num_live(self._pool) > 0


class NoPrefillPool:
    """``PrefillClient`` of an app without a prefill pool: never healthy, so every request
    prefills locally on decode."""

    async def prefill(self, request: PrefillRequest) -> PrefillResult:
        """Always unavailable."""
        raise UnavailableError(f"request {request.request_id}: this app has no prefill pool")

    async def prefill_stream(
        self, request: PrefillRequest
    ) -> AsyncIterator[PrefillStarted | PrefillResult]:
        """Always unavailable."""
        raise UnavailableError(f"request {request.request_id}: this app has no prefill pool")
        yield  # an async generator, as the protocol's callers iterate it

    def healthy(self) -> bool:
        """Always False."""
        return False


class ServeDecodeClient:
    """``DecodeClient`` over the Decode deployment's streaming handle."""

    def __init__(self, handle: DeploymentHandle, watch: PoolWatch, pool: str = "decode") -> None:
        self._generate = handle.options(method_name="generate", stream=True)
        self._watch = watch
        self._pool = pool

    async def generate(self, request: DecodeRequest) -> AsyncIterator[TokenChunk]:
        """Stream the request's chunks; closing this iterator cancels the replica's stream."""
        with _own_call_id():
            stream = self._generate.remote(to_plain(request))
        assert isinstance(stream, DeploymentResponseGenerator)  # stream=True handle
        try:
            async for data in stream:
                yield from_plain(TokenChunk, data)
        except BackPressureError as e:
            raise OverloadedError(f"decode pool is at capacity: {e}") from e
        except _SERVE_UNAVAILABLE as e:
            raise UnavailableError(f"decode replica unavailable: {type(e).__name__}") from e
        finally:
            stream.cancel()  # no-op once the stream finished; aborts the request otherwise

    def healthy(self) -> bool:
        """True while at least one decode replica reports to the board."""
        return self._watch.num_live(self._pool) > 0
