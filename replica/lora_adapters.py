"""A replica's LoRA adapters by served name: the YAML's ``model.lora_modules``, loaded into the
engine when the replica starts, and the adapters loaded at run time: those the cluster
registers (:meth:`ReplicaAdapters.sync`, fed by the stats board, so a replica started later
loads them too). A registered adapter the engine refuses is kept as an
:class:`~core.lora_registry.AdapterRefusal` (reported in the stats; the load rolls back).

Requests name their adapter by name only (``RoutingKeys.lora_name``); both roles resolve it here
into the engine's :class:`~engine.lora.LoRARequest`, so the prefill and the decode of a request
run under the same adapter (same path, same id, same prefix-cache salt). An unknown name is the
OpenAI 404 (:class:`~core.errors.ModelNotFoundError`). Ids are handed out in load order, one per
name, never reused while the replica lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Sequence

from core.config.lora import LoRAModuleConfig
from core.errors import ErrorReport, InvalidRequestError, ModelNotFoundError, PdserveError
from core.lora_registry import AdapterRefusal, RegisteredAdapter
from engine.async_engine import AsyncEngine
from engine.engine import LLMEngine
from engine.lora import LoRARequest

logger = logging.getLogger(__name__)


class ReplicaAdapters:
    """The adapters one replica serves (thread-safe)."""

    def __init__(self, modules: Sequence[LoRAModuleConfig] = ()) -> None:
        self._lock = threading.Lock()
        self._by_name: dict[str, LoRARequest] = {}
        self._next_id = 1
        for module in modules:
            self._register(module.name, module.path)
        self._static = frozenset(self._by_name)  # the YAML's: never unloaded by a sync
        self._refusals: dict[str, AdapterRefusal] = {}
        self._sync_lock = asyncio.Lock()

    def names(self) -> tuple[str, ...]:
        """Every adapter this replica serves, in load order."""
        with self._lock:
            return tuple(self._by_name)

    def resolve(self, name: str | None) -> LoRARequest | None:
        """The engine's request for adapter ``name`` (None: the base model)."""
        if name is None:
            return None
        with self._lock:
            found = self._by_name.get(name)
        if found is None:
            raise ModelNotFoundError(
                f"the LoRA adapter {name!r} is not loaded on this replica", param="model"
            )
        return found

    def load_all(self, engine: AsyncEngine) -> None:
        """Load (and check) every registered adapter into ``engine``'s host memory now, while
        the replica starts; the first bad one raises its ``LoRAAdapterError``."""
        for request in self._by_name.values():
            engine.submit(functools.partial(LLMEngine.add_lora, lora_request=request)).result()
        if self._by_name:
            logger.info("LoRA adapters loaded: %s", ", ".join(self._by_name))

    async def load(self, engine: AsyncEngine, name: str, path: str) -> LoRARequest:
        """Load adapter ``name`` from ``path`` into ``engine`` and serve it (idempotent for
        the same path); nothing is kept when the engine refuses it."""
        with self._lock:
            request = self._by_name.get(name)
            if request is None:  # an id of its own even if the engine refuses it
                request = LoRARequest(name, self._next_id, path)
                self._next_id += 1
        if request.lora_path != path:
            raise InvalidRequestError(
                f"the LoRA adapter {name!r} is already loaded from {request.lora_path}",
                param="lora_name",
            )
        await engine.call(lambda e: e.add_lora(request))
        with self._lock:
            return self._by_name.setdefault(name, request)

    async def unload(self, engine: AsyncEngine, name: str) -> bool:
        """Stop serving ``name`` and free its memory; False when it was not loaded."""
        with self._lock:
            if name not in self._by_name:
                return False
        await engine.call(lambda e: e.remove_lora(name))
        with self._lock:
            self._by_name.pop(name, None)
        return True

    def refusals(self) -> tuple[AdapterRefusal, ...]:
        """The registered adapters this replica refused."""
        with self._lock:
            return tuple(self._refusals.values())

    async def sync(self, engine: AsyncEngine, registered: Sequence[RegisteredAdapter]) -> None:
        """Serve exactly the YAML's adapters plus ``registered``: load the new ones (a refusal
        is kept, not retried while it stays registered) and unload the others (one still in
        use stays until a later sync)."""
        async with self._sync_lock:
            wanted = {adapter.name: adapter for adapter in registered}
            with self._lock:
                self._refusals = {
                    n: r
                    for n, r in self._refusals.items()
                    if n in wanted and wanted[n].path == r.path
                }
                refused = set(self._refusals)
            for adapter in wanted.values():
                if adapter.name not in self.names() and adapter.name not in refused:
                    await self._try_load(engine, adapter)
            for name in self.names():
                if name not in self._static and name not in wanted:
                    with contextlib.suppress(InvalidRequestError):  # in use: the next sync
                        await self.unload(engine, name)

    async def _try_load(self, engine: AsyncEngine, adapter: RegisteredAdapter) -> None:
        try:
            await self.load(engine, adapter.name, adapter.path)
        except PdserveError as e:
            logger.warning("LoRA adapter %s refused: %s", adapter.name, e.message)
            refusal = AdapterRefusal(adapter.name, adapter.path, ErrorReport.of(e))
            with self._lock:
                self._refusals[adapter.name] = refusal

    def _register(self, name: str, path: str) -> None:
        self._by_name[name] = LoRARequest(name, self._next_id, path)
        self._next_id += 1
