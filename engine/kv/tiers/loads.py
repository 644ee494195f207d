"""Loads in flight: which request's lower-tier blocks are being copied back, and which are done."""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass

from core.hashing import BlockHash
from engine.kv.tiers.io import LoadPart, LoadResult


@dataclass(frozen=True)
class FinishedLoad:
    """A load the engine thread can act on: its first ``num_loaded`` blocks are in place."""

    request_id: str
    num_loaded: int
    num_requested: int


@dataclass(frozen=True)
class Load:
    """One request's blocks being brought back, and the future of the copy."""

    request_id: str
    parts: list[LoadPart]
    future: Future[LoadResult]


class LoadTracker:
    """Loads by request id; the engine thread starts, polls and settles them."""

    def __init__(self) -> None:
        self._loads: dict[str, Load] = {}

    def __len__(self) -> int:
        return len(self._loads)

    def add(self, load: Load) -> None:
        """Track a started load (one per request)."""
        self._loads[load.request_id] = load

    def take_done(self) -> list[Load]:
        """Remove and return every load whose copy has finished."""
        done = [load for load in self._loads.values() if load.future.done()]
        for load in done:
            del self._loads[load.request_id]
        return done

    def wait_any(self, timeout_s: float) -> None:
        """Block until a load finishes or ``timeout_s`` passes."""
        futures = [load.future for load in self._loads.values()]
        if futures:
            wait(futures, timeout=timeout_s, return_when=FIRST_COMPLETED)

    def pinned_hashes(self) -> set[BlockHash]:
        """Every hash a tracked load holds a pin on."""
        return {part.block_hash for load in self._loads.values() for part in load.parts}
