"""The LoRA adapters an ingress serves: each one's name, the served model it belongs to and its
path, found by the name clients send as ``model``.

Starts with every model's ``model.lora_modules`` and changes when ``/v1/load_lora_adapter`` or
``/v1/unload_lora_adapter`` succeeded on every replica (``cluster.ingress.app.lora_routes``).
A request naming an adapter runs on its base model's route with ``RoutingKeys.lora_name`` set.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from core.config.lora import LoRAModuleConfig


@dataclass(frozen=True)
class ServedAdapter:
    """One adapter as the ingress serves it."""

    name: str
    base: str
    """The canonical served name of its base model (``parent`` in ``/v1/models``)."""
    path: str


class ServedAdapters:
    """Adapters by name (thread-safe)."""

    def __init__(self, adapters: Iterable[ServedAdapter] = ()) -> None:
        self._lock = threading.Lock()
        self._by_name = {adapter.name: adapter for adapter in adapters}

    @classmethod
    def of_models(
        cls, modules_by_base: Iterable[tuple[str, tuple[LoRAModuleConfig, ...]]]
    ) -> ServedAdapters:
        """The YAML's adapters: ``(base served name, its lora_modules)`` per model."""
        return cls(
            ServedAdapter(module.name, base, module.path)
            for base, modules in modules_by_base
            for module in modules
        )

    def find(self, name: str | None) -> ServedAdapter | None:
        """The adapter ``name`` names (None: not an adapter)."""
        if name is None:
            return None
        with self._lock:
            return self._by_name.get(name)

    def all(self) -> list[ServedAdapter]:
        """Every adapter, in load order."""
        with self._lock:
            return list(self._by_name.values())

    def add(self, adapter: ServedAdapter) -> None:
        """Serve ``adapter`` (replacing one of the same name)."""
        with self._lock:
            self._by_name[adapter.name] = adapter

    def remove(self, name: str) -> None:
        """Stop serving ``name`` (no-op when it is not served)."""
        with self._lock:
            self._by_name.pop(name, None)
