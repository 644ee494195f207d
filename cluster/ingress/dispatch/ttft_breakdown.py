"""Where one request's time to first token went, as the server saw it (``usage.ttft_breakdown``).

The ingress measures TTFT from arrival to the first token it hands the client; the workers
report their own stage times (``core.messages.StageTimes``): the engine queue and the prefill
(on the prefill replica, or on decode for a local prefill), exporting the KV (remote path),
then on decode pulling it (``transfer``) and the first decode step. ``dispatch`` is what TTFT
holds besides queue, prefill and export: admission, routing and the calls between processes.
On the remote path the first token leaves before the KV moves, so ``transfer`` and
``first_decode`` delay the second token, not the first; they are reported alongside so a load
test sees the whole hand-off (``ttft_ms + transfer_ms + first_decode_ms`` bounds the time to
the first decoded token).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from core.messages import StageTimes


@dataclass(frozen=True)
class TtftBreakdown:
    """One request's TTFT and the stage times behind it (seconds)."""

    path: str
    """``remote`` (prefill pool) or ``local`` (prefilled on decode)."""
    ttft_s: float
    stages: StageTimes

    @property
    def dispatch_s(self) -> float:
        """TTFT not spent queued, prefilling or exporting (never negative)."""
        stages = self.stages
        return max(0.0, self.ttft_s - stages.queue_s - stages.prefill_s - stages.export_s)

    def body(self) -> dict[str, Any]:
        """The JSON object (milliseconds, 3 decimals) the ``usage`` object carries."""
        ms = {f"{name[:-2]}_ms": _ms(value) for name, value in _fields(self.stages)}
        return {"path": self.path, "ttft_ms": _ms(self.ttft_s),
                "dispatch_ms": _ms(self.dispatch_s), **ms}  # fmt: skip


def _fields(stages: StageTimes) -> list[tuple[str, float]]:
    return [(f.name, float(getattr(stages, f.name))) for f in dataclasses.fields(stages)]


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def with_prefill(current: StageTimes, reported: StageTimes) -> StageTimes:
    """``current`` with a prefill's queue, prefill and export times."""
    return dataclasses.replace(
        current,
        queue_s=reported.queue_s,
        prefill_s=reported.prefill_s,
        export_s=reported.export_s,
    )


def with_import(current: StageTimes, reported: StageTimes) -> StageTimes:
    """``current`` with an import's transfer and first-decode times."""
    return dataclasses.replace(
        current, transfer_s=reported.transfer_s, first_decode_s=reported.first_decode_s
    )
