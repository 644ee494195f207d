"""The planner's recent decisions, as ``pdserve status`` shows them.

The planner runs inside Serve's controller, which has no route to the CLI; it leaves its last
decisions in Ray's GCS key-value store under :func:`decisions_key` (one small JSON document per
app, rewritten only when a pool's target changes) and ``pdserve status`` reads them back.
Frozen dataclasses through ``core.codec``, like every other message between processes.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass

from core.codec import from_plain, to_plain

KEEP = 20
"""Decisions kept per app (the newest)."""


def decisions_key(app_name: str) -> bytes:
    """The GCS key an app's planner writes its decisions under."""
    return f"pdserve/planner/{app_name}".encode()


@dataclass(frozen=True)
class PlannerDecision:
    """One change of a pool's target: when, from what, to what, and why."""

    unix_s: float
    pool: str
    previous: int
    target: int
    reason: str
    detail: str = ""
    """The numbers the decision was made from (signals, corrections)."""


@dataclass(frozen=True)
class PlannerLog:
    """An app's planner mode and its newest decisions, oldest first."""

    mode: str
    decisions: tuple[PlannerDecision, ...] = ()

    def with_decision(self, decision: PlannerDecision) -> PlannerLog:
        kept = deque(self.decisions, maxlen=KEEP)
        kept.append(decision)
        return PlannerLog(self.mode, tuple(kept))

    def to_json(self) -> bytes:
        return json.dumps(to_plain(self)).encode()

    @classmethod
    def from_json(cls, data: bytes) -> PlannerLog:
        return from_plain(cls, json.loads(data))
