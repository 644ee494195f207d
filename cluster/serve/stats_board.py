"""Where every prefill and decode replica posts its stats: the cluster's live view.

``StatsBoard`` is a small Serve deployment (one replica, no CPU reserved) that keeps the latest
report of each replica and forgets a replica that stops reporting (killed, scaled away) after
``stale_after_s``. The ingress reads it for ``/metrics`` and for "is any prefill replica
alive", and ``pdserve status`` for per-replica KV usage and transfers in flight.

Replicas report through a :class:`BoardReporter`, which the app builder hands to the role
deployments; they call it once with their role and their ``stats`` function. Reports are
:class:`~core.stats.ReplicaReport` s, stored and returned as plain data (``core.codec``);
:func:`decode_reports` gives readers the typed form.

The board is also the registry of LoRA adapters loaded at run time (``/v1/load_lora_adapter``,
``cluster.serve.lora_admin``): :meth:`StatsBoard.register_adapter` keeps them per model, and
every replica reads its model's after each report, so replicas started later load them too.

The board is also how a load test's transfer faults reach the replicas (``/admin/faults``,
off unless ``server.fault_injection``): :meth:`StatsBoard.set_faults` holds a
:class:`~core.transfer_faults.FaultInjection` for a role until it expires, and each report's
answer carries the role's current one, so every replica applies it within one report interval.

The board also holds the app's generated KV transfer secret (None when a token is configured):
a rolling upgrade's second app fetches it at replica boot (``cluster.serve.board_kv_token``)
instead of carrying one of its own. Only callers inside the Ray cluster reach it (the board has
no HTTP route), and nothing logs it.

And it holds the pools a stepped rollout cordoned (:meth:`StatsBoard.cordon`): a version's pool
about to go to 0 takes no new request (the ingress's ``PoolWatch`` counts none of its replicas
live) while its last ones finish; their reports stay on the board, for the rollout's drain. A
cordoned pool whose streams outlast the drain is asked to hand them off
(:meth:`StatsBoard.hand_off`): each report's answer (a :class:`BoardReply`) tells its replicas,
which stop their decoding requests and export their blocks for the replicas that continue them
(only while a replica of their KV fingerprint serves to continue them: never across versions).
A single replica Serve is stopping while its pool stays (a scale-down, a rollout step that keeps
the pool above 0) is asked the same, once, by the ingress that saw it leave its routers
(:meth:`StatsBoard.hand_off_replica`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve

from cluster.routing import routed_replicas
from cluster.serve.pool_options import BOARD_DEPLOYMENT
from core.codec import from_plain, to_plain
from core.config import pool_key
from core.lora_registry import RegisteredAdapter
from core.stats import ReplicaReport, ReplicaStats
from core.transfer_faults import FaultInjection
from replica import KVToken

logger = logging.getLogger(__name__)

StatsFn = Callable[[], ReplicaStats]
FaultsFn = Callable[[FaultInjection], None]
HandOffFn = Callable[[], Awaitable[object]]
AdaptersFn = Callable[[Sequence[RegisteredAdapter]], Awaitable[None]]


@dataclass(frozen=True)
class BoardReply:
    """The board's answer to one report."""

    faults: FaultInjection | None = None
    """The transfer faults the replica's role injects now (None: none)."""
    hand_off: bool = False
    """The replica's pool is being taken away: hand the requests in flight off."""

    @classmethod
    def of(cls, answer: Mapping[str, Any] | None) -> BoardReply:
        """A report's plain answer as a reply; a board of an earlier pdserve (a rolling
        upgrade of pdserve itself reports to the running app's board) answered the faults
        alone, or None."""
        if answer is None:
            return cls()
        if set(answer) <= {"faults", "hand_off"}:
            return from_plain(cls, answer)
        return cls(faults=from_plain(FaultInjection, answer))


def decode_reports(snapshot: Mapping[str, list[dict[str, Any]]]) -> dict[str, list[ReplicaReport]]:
    """A :meth:`StatsBoard.snapshot` as typed reports."""
    return {
        role: [from_plain(ReplicaReport, report) for report in reports]
        for role, reports in snapshot.items()
    }


class StatsBoard:
    """The latest report of every live replica, by role."""

    def __init__(self, stale_after_s: float = 3.0, kv_token: KVToken | None = None) -> None:
        self.epoch = uuid.uuid4().hex  # a restarted board is a new one: readers count it
        self._stale_after_s = stale_after_s
        self._reports: dict[str, dict[str, Any]] = {}
        self._faults: dict[str, tuple[dict[str, Any], float]] = {}  # role -> (plain, until)
        self._adapters: dict[str, dict[str, str]] = {}  # model scope -> LoRA name -> path
        self._kv_token = kv_token
        self._cordoned: set[tuple[str, str]] = set()  # (app, deployment)
        self._handing_off: set[tuple[str, str]] = set()  # cordoned pools asked to hand off
        self._hand_off_once: set[str] = set()  # replicas to hand off at their next report

    def kv_token(self) -> str | None:
        """The app's generated KV transfer secret, for its rollout's second app (None: the app
        runs with a configured token)."""
        return None if self._kv_token is None else self._kv_token.value

    def report(self, replica: dict[str, Any]) -> dict[str, Any]:
        """Store one replica's report (a plain ``ReplicaReport``); answer a plain
        :class:`BoardReply`: the faults its role injects now, whether its pool hands off."""
        now = time.monotonic()
        replica_id = str(replica["replica_id"])
        self._reports[replica_id] = {**replica, "received_s": now}
        faults = self._faults.get(str(replica["role"]))
        pool = routed_replicas.deployment_of(str(replica.get("actor_name", "")))
        once = replica_id in self._hand_off_once
        self._hand_off_once.discard(replica_id)
        reply = BoardReply(
            faults=None
            if faults is None or faults[1] <= now
            else from_plain(FaultInjection, faults[0]),
            hand_off=once
            or (pool is not None and pool in self._handing_off and self._can_continue(replica)),
        )
        plain: dict[str, Any] = to_plain(reply)
        return plain

    def set_faults(self, role: str, faults: dict[str, Any], duration_s: float) -> None:
        """Have every replica of ``role`` inject ``faults`` (a plain ``FaultInjection``) for
        the next ``duration_s``."""
        self._faults[role] = (faults, time.monotonic() + duration_s)

    def register_adapter(self, model: str, name: str, path: str) -> None:
        """Every replica of the model of scope ``model`` serves LoRA adapter ``name`` from
        ``path`` (they read it after their next report; replicas started later too)."""
        self._adapters.setdefault(model, {})[name] = path

    def unregister_adapter(self, model: str, name: str) -> None:
        """The model's replicas stop serving ``name`` (no-op when it is not registered)."""
        self._adapters.get(model, {}).pop(name, None)

    def adapters(self, model: str) -> list[dict[str, Any]]:
        """The registered adapters of ``model`` (plain ``RegisteredAdapter`` s)."""
        registered = self._adapters.get(model, {})
        return [to_plain(RegisteredAdapter(name, path)) for name, path in registered.items()]

    def forget(self, replica_id: str) -> None:
        """Drop a replica's report at once (it is shutting down)."""
        self._reports.pop(replica_id, None)
        self._hand_off_once.discard(replica_id)

    def cordon(self, app_name: str, deployment: str, cordoned: bool) -> None:
        """Whether new requests must keep off ``app_name``'s ``deployment`` (a pool a stepped
        rollout is taking to 0)."""
        if cordoned:
            self._cordoned.add((app_name, deployment))
        else:
            self._cordoned.discard((app_name, deployment))
            self._handing_off.discard((app_name, deployment))

    def hand_off(self, app_name: str, deployment: str) -> None:
        """Have the replicas of cordoned ``app_name``'s ``deployment`` hand their requests off
        (from their next report on, until the pool is uncordoned); no-op for a pool that is not
        cordoned (its requests would come back to it). A replica no live replica of its own KV
        fingerprint could continue keeps its requests (:meth:`_can_continue`)."""
        if (app_name, deployment) in self._cordoned:
            self._handing_off.add((app_name, deployment))

    def _can_continue(self, replica: Mapping[str, Any]) -> bool:
        """Whether a replica of ``replica``'s pool outside any cordoned pool reports its KV
        fingerprint: one that pulls its requests' blocks and continues them under the same
        weights. Without one they stay where they are until Serve stops the replica (its
        graceful shutdown), rather than be recomputed under another version's weights and
        mix two versions' tokens in one output."""
        fingerprint = replica["stats"].get("kv_fingerprint")
        for other in self._reports.values():
            if (
                other["replica_id"] != replica["replica_id"]
                and other["role"] == replica["role"]
                and other.get("model", "") == replica.get("model", "")
                and other["stats"].get("kv_fingerprint") == fingerprint
                and routed_replicas.deployment_of(str(other.get("actor_name", "")))
                not in self._cordoned
            ):
                return True
        return False

    def hand_off_replica(self, replica_id: str) -> None:
        """Have replica ``replica_id`` hand off the requests it decodes at its next report,
        once: Serve is stopping it (a router saw it leave its set), so no new one reaches it."""
        if replica_id in self._reports:
            self._hand_off_once.add(replica_id)

    def view(self) -> dict[str, Any]:
        """:meth:`snapshot` with this board's epoch and the cordoned pools:
        ``{"epoch": str, "pools": ..., "cordoned": [[app, deployment], ...]}``."""
        cordoned = [list(pool) for pool in sorted(self._cordoned)]
        return {"epoch": self.epoch, "pools": self.snapshot(), "cordoned": cordoned}

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        """Fresh reports grouped by pool (``{"prefill": [...], "decode": [...]}``; with several
        models, ``core.config.pool_key`` names: ``decode/tiny-moe``)."""
        now = time.monotonic()
        stale = [k for k, r in self._reports.items() if now - r["received_s"] > self._stale_after_s]
        for replica_id in stale:
            del self._reports[replica_id]
            self._hand_off_once.discard(replica_id)
        reports = sorted(self._reports.values(), key=lambda r: str(r["replica_id"]))
        scoped = any(r.get("model") for r in reports)  # several models: no unscoped pools
        grouped: dict[str, list[dict[str, Any]]] = {} if scoped else {"prefill": [], "decode": []}
        for report in reports:
            pool = pool_key(str(report["role"]), str(report.get("model", "")))
            grouped.setdefault(pool, []).append(
                {k: v for k, v in report.items() if k != "received_s"}
            )
        return grouped


@dataclass(frozen=True)
class BoardReporter:
    """Posts a replica's stats to the board of ``app_name`` every ``interval_s``.

    Called once from a role deployment's constructor (inside the replica's event loop):
    ``stop = reporter("prefill", worker.stats)``; ``stop()`` on shutdown ends the reports and
    removes the replica from the board at once.
    """

    app_name: str
    interval_s: float = 0.5
    model: str = ""
    """The scope of the model whose replicas report through this (empty: the only model)."""

    def __call__(
        self,
        role: str,
        stats: StatsFn,
        on_faults: FaultsFn | None = None,
        on_adapters: AdaptersFn | None = None,
        on_hand_off: HandOffFn | None = None,
    ) -> Callable[[], None]:
        """Start reporting ``stats()`` as ``role`` in the background; returns ``stop``.
        ``on_faults`` gets the faults the board answers whenever they change; ``on_adapters``
        is awaited with the model's registered LoRA adapters after every report;
        ``on_hand_off`` after every report whose answer asks the pool to hand off."""
        replica_id = serve.get_replica_context().replica_id.unique_id
        task = asyncio.get_running_loop().create_task(
            self._report_forever(role, replica_id, stats, on_faults, on_adapters, on_hand_off)
        )

        def stop() -> None:
            task.cancel()
            self._board().forget.remote(replica_id)

        return stop

    def _board(self) -> Any:
        return serve.get_deployment_handle(BOARD_DEPLOYMENT, self.app_name)

    async def _report_forever(
        self,
        role: str,
        replica_id: str,
        stats: StatsFn,
        on_faults: FaultsFn | None,
        on_adapters: AdaptersFn | None,
        on_hand_off: HandOffFn | None,
    ) -> None:
        context = ray.get_runtime_context()
        report = ReplicaReport(
            role=role,
            replica_id=replica_id,
            actor_name=context.get_actor_name() or "",
            node_id=context.get_node_id(),
            node_ip=ray.util.get_node_ip_address(),
            pid=os.getpid(),
            stats=ReplicaStats(),
            model=self.model,
        )
        board = self._board()
        applied: FaultInjection | None = None
        while True:
            try:
                fresh = dataclasses.replace(report, stats=stats())
                reply = BoardReply.of(await board.report.remote(to_plain(fresh)))
                if on_faults is not None and reply.faults != applied:
                    on_faults(FaultInjection() if reply.faults is None else reply.faults)
                    logger.warning("transfer faults of %s now %s", replica_id, reply.faults)
                    applied = reply.faults
                if on_hand_off is not None and reply.hand_off:
                    await on_hand_off()
                if on_adapters is not None:
                    registered = await board.adapters.remote(self.model)
                    await on_adapters([from_plain(RegisteredAdapter, a) for a in registered])
            except Exception as e:  # the board restarting must not stop the reports
                logger.warning("stats report of %s failed: %s", replica_id, e)
            await asyncio.sleep(self.interval_s)
