"""One replica lifecycle for both roles: boot once, report, answer Serve's hooks, stop.

:class:`RoleReplica` is the base of both roles' Serve deployment classes. Its constructor is the
one boot sequence: decode the :class:`~replica.spec.ReplicaSpec` (fetching the app's KV secret
when its hooks say where from), start the KV-event feed, join the gang (expert-parallel pools),
ask the role for its worker (:meth:`RoleReplica.build_worker`, each role's ``build.py``), then
start reporting stats. It answers Serve's health check, routing-stats and autoscaling-stats
hooks, turns a worker's typed failure into the one :class:`~core.errors.ErrorReport` both roles
send, and on the stop drains what others still need, ends the reports and the feed, and shuts
the worker down. A boot that fails half-way closes what it had started.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from core.codec import from_plain, to_plain
from core.config import Role
from core.errors import ConfigError, ErrorReport, MessageError, PdserveError, UnavailableError
from core.kv_compat import KVCompat
from core.lora_registry import RegisteredAdapter
from core.messages import PrefixCopyCall
from core.stats import ReplicaStats
from core.transfer_faults import FaultInjection
from engine.async_engine import AsyncEngine
from engine.gangs.lockstep_driver import expert_load_stats
from replica.hooks import KVEventPublisher, KVTokenSource, ReplicaHooks
from replica.kv_token import is_configured
from replica.lora_adapters import ReplicaAdapters
from replica.planner_signals import PlannerSignals
from replica.prefix_copies import PrefixCopies
from replica.spec import ReplicaSpec, WorkerBoot
from transfer import GrpcKVTransport, KVTransport
from transfer.block_store import BlockStore

logger = logging.getLogger(__name__)

_EXPORT_DRAIN_POLL_S = 0.05
"""How often a stopping replica checks its prefix exports (a bounded wait, not a request path)."""


class RoleWorker(Protocol):
    """What :class:`RoleReplica` needs of a prefill or decode worker."""

    kv_compat: KVCompat | None
    """The compatibility of the worker's KV (``replica.kv_compat``); None: undeclared."""

    @property
    def engine(self) -> AsyncEngine:
        """The worker's engine."""
        ...

    @property
    def transport(self) -> KVTransport:
        """The worker's KV transport (hot-prefix exports leave through it)."""
        ...

    @property
    def adapters(self) -> ReplicaAdapters:
        """The LoRA adapters its requests may name."""
        ...

    def stats(self) -> ReplicaStats:
        """KV blocks, queues and transfer counters."""
        ...

    async def drain(self, timeout_s: float) -> int:
        """Before a planned stop: wait (bounded) for what others still need from this replica;
        returns what is left."""
        ...

    async def shutdown(self) -> None:
        """Stop the transport and the engine."""
        ...


WorkerT = TypeVar("WorkerT", bound=RoleWorker)


def joined_token(spec: ReplicaSpec, source: KVTokenSource | None) -> ReplicaSpec:
    """``spec`` with the KV secret of the app the replica joins, fetched from ``source`` (first,
    before anything is started that a failed fetch would have to close); unchanged without a
    source or when a token is configured in this process (a configured token wins)."""
    if source is None or is_configured(spec.transfer):
        return spec
    return dataclasses.replace(spec, kv_token=source.fetch())


class RoleReplica(Generic[WorkerT]):
    """A replica of one role: ``role`` names it, :meth:`build_worker` makes its worker."""

    role: ClassVar[Role]

    def __init__(
        self, spec: ReplicaSpec | Mapping[str, Any], hooks: ReplicaHooks | None = None
    ) -> None:
        """Boot from ``spec`` (a :class:`ReplicaSpec` or its plain form) with ``hooks``."""
        self.spec = spec if isinstance(spec, ReplicaSpec) else from_plain(ReplicaSpec, spec)
        if self.spec.role != self.role:
            raise ConfigError(
                f"a {self.role} replica got a {self.spec.role} spec", param="spec.role"
            )
        hooks = hooks or ReplicaHooks()
        self.spec = joined_token(self.spec, hooks.kv_token)
        identity = hooks.identity.current()
        self._num_requests = 0
        self._planner_signals = PlannerSignals()
        self._publisher: KVEventPublisher | None = None
        if hooks.kv_events is not None:
            self._publisher = hooks.kv_events.start(identity.replica_id, identity.app_name)
        callback = self._publisher.callback if self._publisher is not None else None
        try:
            engine = None
            if hooks.gang is not None:
                engine = hooks.gang.start(
                    self.spec.model, self.spec.engine, kv_event_callback=callback
                )
            boot = WorkerBoot(
                self.spec, self.spec.transfer_config(), identity.node_host, callback, engine
            )
            self.worker: WorkerT = self.build_worker(boot)
            self._replica_id = identity.replica_id
            self._transfer = boot.transfer
            self._node_host = boot.node_host
            self._export_transport: KVTransport | None = None  # decode's, for prefix copies
            self._prefix_copies: PrefixCopies | None = None  # made by the first copy
        except BaseException:
            if self._publisher is not None:
                self._publisher.close()
            raise
        self._stop_reporting: Callable[[], None] | None = None
        if hooks.stats_reporter is not None:
            on_adapters = self.sync_adapters if self.spec.engine.enable_lora else None
            self._stop_reporting = hooks.stats_reporter(
                self.role, self.replica_stats, self.fault_handler(), on_adapters,
                self.hand_off_handler(),
            )  # fmt: skip
        self._stopped = False

    def build_worker(self, boot: WorkerBoot) -> WorkerT:
        """The role's worker (its ``build.py``), from what the boot prepared."""
        raise NotImplementedError(f"{type(self).__name__} builds no worker")

    def fault_handler(self) -> Callable[[FaultInjection], None] | None:
        """Where transfer faults the cluster injects go; None: this role has no such faults."""
        return None

    def hand_off_handler(self) -> Callable[[], Awaitable[object]] | None:
        """What runs when the cluster asks this replica to hand its requests off before it
        leaves (``StatsBoard.hand_off``); None: this role has nothing to hand off."""
        return None

    async def sync_adapters(self, registered: Sequence[RegisteredAdapter]) -> None:
        """Serve the LoRA adapters the cluster registered (and the YAML's), no others."""
        await self.worker.adapters.sync(self.worker.engine, registered)

    def drain_timeout_s(self) -> float:
        """How long the stop waits for what others still need of this replica (0: none)."""
        return 0.0

    def count_request(self) -> None:
        """One more call received (``requests_total`` in the stats)."""
        self._num_requests += 1

    def replica_stats(self) -> ReplicaStats:
        """The worker's stats, expert load (expert-parallel ranks) and ``requests_total``,
        the calls this replica received."""
        return dataclasses.replace(
            self.worker.stats(),
            expert_load=expert_load_stats(self.worker.engine),
            requests_total=self._num_requests,
            served_adapters=self.worker.adapters.names(),
            adapter_refusals=self.worker.adapters.refusals(),
        )

    def stats(self) -> dict[str, Any]:
        """:meth:`replica_stats` as plain data (the Serve method; decode with ``core.codec``)."""
        plain: dict[str, Any] = to_plain(self.replica_stats())
        return plain

    def report_failure(self, request_id: str, error: PdserveError) -> ErrorReport:
        """Log a request's typed failure and return what the caller receives."""
        logger.info("%s %s failed: %s: %s", self.role, request_id, error.error_type, error.message)
        return ErrorReport.of(error)

    def check_health(self) -> None:
        """Serve's health check: unhealthy once the engine stopped (for an expert-parallel
        rank: its gang broke, so Serve restarts the whole gang)."""
        if not self.worker.engine.is_running():
            raise UnavailableError(f"the {self.role} engine stopped")

    def record_routing_stats(self) -> dict[str, Any]:
        """Serve's routing-stats hook: ``core.stats.RoutingStats`` as plain data (Serve's hook
        must return a dict; the routers decode it with the same codec)."""
        # NOTE: every field it needs is the engine's; no transfer-metrics snapshot per report.
        compat = self.worker.kv_compat
        stats = dataclasses.replace(
            self.worker.engine.kv_stats().routing(),
            kv_fingerprint="" if compat is None else compat.fingerprint(),
        )
        plain: dict[str, Any] = to_plain(stats)
        return plain

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metrics hook: the load and rates pdserve's planner sizes
        pools by (``replica.planner_signals``; Serve averages each over its look-back window)."""
        return self._planner_signals.report(self.replica_stats())

    async def export_prefix(self, call: dict[str, Any]) -> dict[str, Any] | None:
        """A hot prefix's holder: export the cached blocks a plain ``PrefixCopyCall`` asks for;
        a plain ``PrefixExport``, or None when not even the first block is cached."""
        export = await self.prefix_copies().export(from_plain(PrefixCopyCall, call).request)
        return None if export is None else to_plain(export)

    async def warm_prefix(self, call: dict[str, Any]) -> dict[str, Any]:
        """A hot prefix's target: pull a plain ``PrefixCopyCall``'s export into the host tier;
        a plain ``replica.prefix_warming.WarmPrefixResult``."""
        copy_call = from_plain(PrefixCopyCall, call)
        if copy_call.export is None:
            raise MessageError("a warm_prefix call needs the holder's export")
        result = await self.prefix_copies().warm(copy_call.request, copy_call.export)
        plain: dict[str, Any] = to_plain(result)
        return plain

    def prefix_copies(self) -> PrefixCopies:
        """Both ends of hot-prefix copies (made at first use). Exports leave through the
        worker's transport when it serves exports (prefill), else through a serving gRPC
        transport over the same KV made now (decode's own transport only imports); pulls go
        over an import-only gRPC transport of the replica's transfer settings. Both declare the
        worker's KV fingerprint: a copy between two versions of a rolling upgrade is refused."""
        if self._prefix_copies is None:
            transfer = self._transfer
            engine = self.worker.engine
            compat = self.worker.kv_compat

            def pull_transport(store: BlockStore) -> KVTransport:
                return GrpcKVTransport(store, transfer, serve=False, kv_compat=compat)

            export_transport = self.worker.transport
            if self.role == "decode":
                self._export_transport = export_transport = GrpcKVTransport(
                    engine.engine.parts.storage,
                    transfer,
                    serve=True,
                    node_host=self._node_host,
                    rank_stores=engine.engine.rank_storages,
                    kv_compat=compat,
                )
            self._prefix_copies = PrefixCopies(
                self._replica_id,
                self.role,
                engine,
                export_transport,
                pull_transport,
                pull_timeout_s=transfer.pull_deadline_s,
            )
        return self._prefix_copies

    async def _drain_prefix_exports(self, deadline_s: float) -> None:
        """Until every prefix export of this replica (a hot prefix's copy, a handed-off
        request's blocks) was pulled, released or expired, at most until ``deadline_s``."""
        copies = self._prefix_copies
        while copies is not None and copies.exporter.num_live_exports:
            if time.monotonic() >= deadline_s:
                logger.warning(
                    "%d prefix exports not pulled before the stop", copies.exporter.num_live_exports
                )
                return
            await asyncio.sleep(_EXPORT_DRAIN_POLL_S)

    def __del__(self) -> Coroutine[Any, Any, None] | None:
        """Serve calls this once when the replica stops (after the requests in flight ended or
        the pool's graceful shutdown timeout) and awaits the stop it returns: drain what others
        still need (a prefill's KV exports, up to :meth:`drain_timeout_s`), end reports, free
        the engine. The garbage collector's later call, or one on a replica whose boot failed,
        returns nothing to await."""
        if getattr(self, "_stopped", True):
            return None
        self._stopped = True
        return self._stop()

    async def _stop(self) -> None:
        # NOTE: the worker's shutdown frees the engine and unlinks its shared KV segment
        # (/dev/shm is RAM): it runs however the drain or the reports end
        try:
            timeout_s = self.drain_timeout_s()
            if timeout_s > 0:
                deadline_s = time.monotonic() + timeout_s
                await self.worker.drain(timeout_s)
                await self._drain_prefix_exports(deadline_s)
        finally:
            try:
                if self._stop_reporting is not None:
                    self._stop_reporting()
                if self._publisher is not None:
                    self._publisher.close()
                if self._export_transport is not None:
                    await asyncio.to_thread(self._export_transport.close)
            finally:
                await self.worker.shutdown()
