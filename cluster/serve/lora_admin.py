"""The cluster side of ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``
(``cluster.ingress.app.lora_routes``): register the adapter on the stats board, which every
replica of the model's two pools reads after each report (``cluster.serve.stats_board``), then
wait until each live replica serves it — or one refused it: then unregister it (the replicas
that loaded it unload it) and raise that replica's typed error. Nothing stays half-loaded.

It is also how every ingress replica reads the registry (``cluster.ingress.lora_adapters``): the
board's adapters of each model, as fresh as the replicas' (one report interval), so a load or an
unload through one ingress reaches the others, and an ingress rebuilt or started later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from ray.exceptions import RayError
from ray.serve.exceptions import DeploymentUnavailableError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle

from cluster.ingress.lora_adapters import ServedAdapter
from cluster.serve.stats_board import BoardReporter, decode_reports
from core.codec import from_plain
from core.config.models import ROLES, pool_key
from core.errors import PdserveError, UnavailableError
from core.lora_registry import RegisteredAdapter
from core.stats import ReplicaReport

logger = logging.getLogger(__name__)

_POLL_S = 0.1
_REGISTRY_TIMEOUT_S = 5.0  # a registry read never holds a request longer
_BOARD_DOWN = (RayError, DeploymentUnavailableError, ReplicaUnavailableError, TimeoutError)


class ServeLoRAAdmin:
    """Loads and unloads adapters on every replica of the app whose stats board is ``board``;
    ``scopes``: each model serving adapters, its canonical name -> its scope."""

    max_age_s = BoardReporter.interval_s
    """An ingress's view of the registry is re-read when older than the replicas' (they read it
    after each report)."""

    def __init__(
        self, board: DeploymentHandle, scopes: Mapping[str, str], timeout_s: float = 60.0
    ) -> None:
        self._board = board
        self._scopes = dict(scopes)
        self._timeout_s = timeout_s

    @property
    def bases(self) -> tuple[str, ...]:
        """The models serving adapters, by canonical name."""
        return tuple(self._scopes)

    async def registered(self) -> list[ServedAdapter]:
        """Every adapter registered on the board, on every model serving adapters."""

        async def of_model(scope: str) -> list[dict[str, object]]:
            plain: list[dict[str, object]] = await self._board.adapters.remote(scope)
            return plain

        bases = list(self._scopes)
        reads = asyncio.gather(*(of_model(self._scopes[base]) for base in bases))
        try:
            per_base = await asyncio.wait_for(reads, _REGISTRY_TIMEOUT_S)
        except _BOARD_DOWN as e:
            raise UnavailableError(f"the LoRA registry (stats board) did not answer: {e!r}") from e
        return [
            ServedAdapter(registered.name, base, registered.path)
            for base, plain in zip(bases, per_base, strict=True)
            for registered in (from_plain(RegisteredAdapter, a) for a in plain)
        ]

    async def load(self, adapter: ServedAdapter) -> None:
        """Every live replica of the base model's pools serves ``adapter``, or none does."""
        scope = self._scopes[adapter.base]
        await self._board.register_adapter.remote(scope, adapter.name, adapter.path)
        try:
            await self._wait(scope, lambda r: _served(r, adapter), f"load {adapter.name!r}")
        except PdserveError:
            await self._board.unregister_adapter.remote(scope, adapter.name)
            raise
        logger.info("LoRA adapter %s loaded on every %s replica", adapter.name, adapter.base)

    async def unload(self, adapter: ServedAdapter) -> None:
        """No replica serves ``adapter`` any more (one still running requests under it stops
        once they end)."""
        scope = self._scopes[adapter.base]
        await self._board.unregister_adapter.remote(scope, adapter.name)

        def gone(report: ReplicaReport) -> bool:
            return adapter.name not in report.stats.served_adapters

        await self._wait(scope, gone, f"unload {adapter.name!r}")
        logger.info("LoRA adapter %s unloaded", adapter.name)

    async def _wait(self, scope: str, done: Callable[[ReplicaReport], bool], what: str) -> None:
        deadline_s = time.monotonic() + self._timeout_s
        while True:
            reports = await self._reports(scope)
            if reports and all(done(r) for r in reports):
                return
            if time.monotonic() > deadline_s:
                waiting = [r.replica_id for r in reports if not done(r)] or ["no live replica"]
                raise UnavailableError(
                    f"{what} timed out after {self._timeout_s:g} s waiting for {', '.join(waiting)}"
                )
            await asyncio.sleep(_POLL_S)

    async def _reports(self, scope: str) -> list[ReplicaReport]:
        by_pool = decode_reports(await self._board.snapshot.remote())
        return [r for role in ROLES for r in by_pool.get(pool_key(role, scope), [])]


def _served(report: ReplicaReport, adapter: ServedAdapter) -> bool:
    """True once the replica serves ``adapter``; raises its refusal's typed error."""
    for refusal in report.stats.adapter_refusals:
        if refusal.name == adapter.name and refusal.path == adapter.path:
            raise refusal.error.to_error()
    return adapter.name in report.stats.served_adapters
