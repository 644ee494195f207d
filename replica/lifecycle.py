"""One replica lifecycle for both roles: boot once, report, answer Serve's hooks, stop.

:class:`RoleReplica` is the base of both roles' Serve deployment classes. Its constructor is the
one boot sequence: decode the :class:`~replica.spec.ReplicaSpec`, start the KV-event feed, join
the gang (expert-parallel pools), ask the role for its worker (:meth:`RoleReplica.build_worker`,
each role's ``build.py``), then start reporting stats. It answers Serve's health check,
routing-stats and autoscaling-stats hooks, turns a worker's typed failure into the one
:class:`~core.errors.ErrorReport` both roles send, and on the stop drains what others still
need, ends the reports and the feed, and shuts the worker down. A boot that fails half-way
closes what it had started.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from core.codec import from_plain, to_plain
from core.config import Role
from core.errors import ConfigError, ErrorReport, PdserveError, UnavailableError
from core.lora_registry import RegisteredAdapter
from core.stats import ReplicaStats
from core.transfer_faults import FaultInjection
from engine.async_engine import AsyncEngine
from engine.gangs.lockstep_driver import expert_load_stats
from replica.hooks import KVEventPublisher, ReplicaHooks
from replica.lora_adapters import ReplicaAdapters
from replica.planner_signals import PlannerSignals
from replica.spec import ReplicaSpec, WorkerBoot

logger = logging.getLogger(__name__)


class RoleWorker(Protocol):
    """What :class:`RoleReplica` needs of a prefill or decode worker."""

    @property
    def engine(self) -> AsyncEngine:
        """The worker's engine."""
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
        except BaseException:
            if self._publisher is not None:
                self._publisher.close()
            raise
        self._stop_reporting: Callable[[], None] | None = None
        if hooks.stats_reporter is not None:
            on_adapters = self.sync_adapters if self.spec.engine.enable_lora else None
            self._stop_reporting = hooks.stats_reporter(
                self.role, self.replica_stats, self.fault_handler(), on_adapters
            )
        self._stopped = False

    def build_worker(self, boot: WorkerBoot) -> WorkerT:
        """The role's worker (its ``build.py``), from what the boot prepared."""
        raise NotImplementedError(f"{type(self).__name__} builds no worker")

    def fault_handler(self) -> Callable[[FaultInjection], None] | None:
        """Where transfer faults the cluster injects go; None: this role has no such faults."""
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
        plain: dict[str, Any] = to_plain(self.worker.engine.kv_stats().routing())
        return plain

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metrics hook: the load and rates pdserve's planner sizes
        pools by (``replica.planner_signals``; Serve averages each over its look-back window)."""
        return self._planner_signals.report(self.replica_stats())

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
        timeout_s = self.drain_timeout_s()
        if timeout_s > 0:
            await self.worker.drain(timeout_s)
        if self._stop_reporting is not None:
            self._stop_reporting()
        if self._publisher is not None:
            self._publisher.close()
        await self.worker.shutdown()
