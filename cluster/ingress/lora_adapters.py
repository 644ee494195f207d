"""The LoRA adapters an ingress serves: each one's name, the served model it belongs to and its
path, found by the name clients send as ``model``.

Two kinds: the YAML's (every model's ``model.lora_modules``, fixed for the app's life) and those
loaded at run time (``/v1/load_lora_adapter``, ``cluster.ingress.app.lora_routes``). The cluster's
:class:`AdapterRegistry` (the stats board) is the source of truth for the second kind, since a
load or an unload may have gone through another ingress replica: :meth:`ServedAdapters.sync`
re-reads it before a request's name is looked up — always for a name not known here (it may have
been loaded elsewhere), for a run-time adapter when this view is older than the registry's
``max_age_s`` (it may have been unloaded elsewhere), never for a base-model name. A registry that
does not answer leaves the last view in place. A request naming an adapter runs on its base
model's route with ``RoutingKeys.lora_name`` set.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from core.config.lora import LoRAModuleConfig
from core.errors import PdserveError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedAdapter:
    """One adapter as the ingress serves it."""

    name: str
    base: str
    """The canonical served name of its base model (``parent`` in ``/v1/models``)."""
    path: str


class AdapterRegistry(Protocol):
    """Where the cluster keeps the adapters loaded at run time, for every ingress to read."""

    @property
    def max_age_s(self) -> float:
        """How old a view of the registry may be before a request naming a run-time adapter
        re-reads it (so an unload elsewhere reaches this ingress within it)."""
        ...

    async def registered(self) -> Sequence[ServedAdapter]:
        """Every adapter loaded at run time, on every served model; a typed error
        (``UnavailableError``) when the registry does not answer."""
        ...


class ServedAdapters:
    """Adapters by name: the YAML's and the registry's (thread-safe)."""

    def __init__(
        self, adapters: Iterable[ServedAdapter] = (), registry: AdapterRegistry | None = None
    ) -> None:
        self._lock = threading.Lock()
        self._static = {adapter.name: adapter for adapter in adapters}
        self._runtime: dict[str, ServedAdapter] = {}
        self._registry = registry
        self._read_s = -math.inf  # when the registry was last read (monotonic)
        self._reading: asyncio.Future[None] | None = None

    @classmethod
    def of_models(
        cls,
        modules_by_base: Iterable[tuple[str, tuple[LoRAModuleConfig, ...]]],
        registry: AdapterRegistry | None = None,
    ) -> ServedAdapters:
        """The YAML's adapters (``(base served name, its lora_modules)`` per model), plus the
        run-time ones of ``registry``."""
        adapters = (
            ServedAdapter(module.name, base, module.path)
            for base, modules in modules_by_base
            for module in modules
        )
        return cls(adapters, registry)

    def find(self, name: str | None) -> ServedAdapter | None:
        """The adapter ``name`` names in this view (None: not an adapter)."""
        if name is None:
            return None
        with self._lock:
            return self._static.get(name) or self._runtime.get(name)

    def all(self) -> list[ServedAdapter]:
        """Every adapter: the YAML's in order, then the run-time ones in load order."""
        with self._lock:
            return [*self._static.values(), *self._runtime.values()]

    def add(self, adapter: ServedAdapter) -> None:
        """Serve ``adapter`` (loaded at run time through this ingress)."""
        with self._lock:
            self._runtime[adapter.name] = adapter

    def remove(self, name: str) -> None:
        """Stop serving ``name`` (no-op when it is not served)."""
        with self._lock:
            self._static.pop(name, None)
            self._runtime.pop(name, None)

    async def sync(self, name: str) -> None:
        """Bring the view up to date before ``name`` (not a base model's) is looked up."""
        if self._registry is None:
            return
        with self._lock:
            if name in self._static:
                return
            known = name in self._runtime
        if known and time.monotonic() - self._read_s < self._registry.max_age_s:
            return
        await self.refresh()

    async def sync_all(self) -> None:
        """Bring the view up to date before every adapter is listed (a read at most once per
        ``max_age_s``)."""
        if self._registry is None:
            return
        if time.monotonic() - self._read_s >= self._registry.max_age_s:
            await self.refresh()

    async def refresh(self) -> None:
        """Re-read the registry now; callers arriving while a read is under way share it."""
        if self._registry is None:
            return
        reading = self._reading
        if reading is None or reading.done():
            reading = self._reading = asyncio.ensure_future(self._read(self._registry))
        await asyncio.shield(reading)

    async def _read(self, registry: AdapterRegistry) -> None:
        try:
            registered = await registry.registered()
        except PdserveError as e:
            logger.warning("LoRA registry unreadable, keeping the last view: %s", e)
            return
        with self._lock:
            self._runtime = {a.name: a for a in registered if a.name not in self._static}
            self._read_s = time.monotonic()
