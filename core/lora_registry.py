"""The cluster's runtime LoRA adapters as messages: what the stats board asks every replica of a
model to serve (:class:`RegisteredAdapter`), and a replica's refusal of one
(:class:`AdapterRefusal`, reported in its stats so the load that asked for it rolls back)."""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import ErrorReport


@dataclass(frozen=True)
class RegisteredAdapter:
    """An adapter loaded at run time (``/v1/load_lora_adapter``): every replica of its model's
    pools serves it, those started later too."""

    name: str
    path: str


@dataclass(frozen=True)
class AdapterRefusal:
    """A replica could not load a registered adapter (it keeps nothing of it)."""

    name: str
    path: str
    error: ErrorReport
