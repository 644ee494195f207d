"""Imports whose prefix partly comes back from this replica's host or disk tier.

A decode import reserves blocks for the whole prompt: device prefix hits are reused, the blocks
right after them that sit in a lower tier are copied back (a tier load), and only the rest is
pulled from the prefill replica. The pull's end (``mark_kv_ready`` / ``mark_kv_failed``) and
the load's end arrive in either order; :class:`ImportLoads` remembers what came in and says
what to do once both have: **ready** when the load brought back every block it promised and
the pull worked, **recompute** locally (the same output) when the load fell short (a corrupted
disk block) or the pull asked for it, **fail** when the pull failed for good.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ImportOutcome(enum.Enum):
    """What happens to an import once its pull and its tier load have both ended."""

    READY = "ready"
    RECOMPUTE = "recompute"
    FAIL = "fail"


@dataclass
class _ImportLoad:
    num_blocks: int
    pull: ImportOutcome | None = None
    num_loaded: int | None = None


class ImportLoads:
    """Per import with a tier load: the pull's outcome and the load's count, until both end."""

    def __init__(self) -> None:
        self._loads: dict[str, _ImportLoad] = {}

    def start(self, request_id: str, num_blocks: int) -> None:
        """A tier load of ``num_blocks`` blocks started for this import."""
        self._loads[request_id] = _ImportLoad(num_blocks)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._loads

    def is_writing(self, request_id: str) -> bool:
        """True while the tier load still copies into the import's blocks."""
        load = self._loads.get(request_id)
        return load is not None and load.num_loaded is None

    def num_writing(self) -> int:
        """Imports whose tier load has not ended."""
        return sum(1 for load in self._loads.values() if load.num_loaded is None)

    def pull_done(self, request_id: str, outcome: ImportOutcome) -> ImportOutcome | None:
        """The pull ended; the final outcome when the load has ended too, else ``None``."""
        self._loads[request_id].pull = outcome
        return self._settled(request_id)

    def load_done(self, request_id: str, num_loaded: int) -> ImportOutcome | None:
        """The tier load ended; the final outcome when the pull has ended too, else ``None``."""
        self._loads[request_id].num_loaded = num_loaded
        return self._settled(request_id)

    def forget(self, request_id: str) -> None:
        """The import ended another way (aborted)."""
        self._loads.pop(request_id, None)

    def _settled(self, request_id: str) -> ImportOutcome | None:
        load = self._loads[request_id]
        if load.pull is None or load.num_loaded is None:
            return None
        del self._loads[request_id]
        if load.pull is ImportOutcome.READY and load.num_loaded < load.num_blocks:
            return ImportOutcome.RECOMPUTE
        return load.pull
