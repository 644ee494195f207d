"""What each fault event of a run did: requests failed, time to recover, counters moved.

* **Requests failed**: a failed request counts against the last event fired before it ended
  (failures before any event are reported apart).
* **Recovery**: from the end of the event's effect (at once for a kill or a scale, after
  ``duration_s`` for a transfer fault), the first moment from which the requests started within
  ``control.recovery_window_s`` all succeed and their p90 TTFT and ITL are within target:
  the run's SLO (``slo.ttft_ms``, ``slo.tpot_ms``) where set, else twice the p90 seen before the
  first event. ``None`` when the run ended first (or no target could be set).
* **Counters**: the server's ``pdserve:`` counters that moved between the event and the next
  one (or the run's end).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from loadtest.config import FaultControlConfig, SloConfig
from loadtest.fault_schedule import Counters, FiredEvent
from loadtest.types import RequestRecord

_MIN_WINDOW_REQUESTS = 2
"""A recovery window needs at least this many finished requests to judge."""


def _p90(values: Sequence[float]) -> float:
    return float(np.percentile(values, 90)) if values else 0.0


def latency_targets(
    records: Sequence[RequestRecord], slo: SloConfig, first_event_s: float
) -> tuple[float, float] | None:
    """(TTFT, ITL) targets in seconds: the SLO's, else 2x the p90 before the first event."""
    if slo.ttft_ms is not None and slo.tpot_ms is not None:
        return slo.ttft_ms / 1000.0, slo.tpot_ms / 1000.0
    before = [r for r in records if r.success and r.start_s + r.latency_s <= first_event_s]
    if len(before) < _MIN_WINDOW_REQUESTS:
        return None
    ttft = slo.ttft_ms / 1000.0 if slo.ttft_ms is not None else 2 * _p90([r.ttft_s for r in before])
    gaps = [g for r in before for g in r.itl_s]
    itl = slo.tpot_ms / 1000.0 if slo.tpot_ms is not None else 2 * _p90(gaps)
    return ttft, itl


def recovery_s(
    records: Sequence[RequestRecord],
    from_s: float,
    targets: tuple[float, float],
    window_s: float,
) -> float | None:
    """Seconds after ``from_s`` until latency is back within ``targets`` (see module doc)."""
    ordered = sorted(records, key=lambda r: r.start_s)
    for candidate in (r for r in ordered if r.start_s >= from_s):
        begin = candidate.start_s
        window = [r for r in ordered if begin <= r.start_s < begin + window_s]
        if len(window) < _MIN_WINDOW_REQUESTS or not all(r.success for r in window):
            continue
        ttft = _p90([r.ttft_s for r in window])
        itl = _p90([g for r in window for g in r.itl_s])
        if ttft <= targets[0] and itl <= targets[1]:
            return begin - from_s
    return None


def _moved(before: Counters, after: Counters) -> dict[str, float]:
    keys = set(before) | set(after)
    deltas = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in keys}
    return {k: round(v, 6) for k, v in sorted(deltas.items()) if v}


def fault_report(
    fired: Sequence[FiredEvent],
    final_counters: Counters,
    records: Sequence[RequestRecord],
    slo: SloConfig,
    control: FaultControlConfig,
) -> dict[str, Any]:
    """The ``fault_events`` list and ``failed_before_events`` count of the summary."""
    if not fired:
        return {"fault_events": [], "failed_before_events": 0}
    targets = latency_targets(records, slo, fired[0].fired_s)
    failed_by_event = [0] * len(fired)
    failed_before = 0
    for record in (r for r in records if not r.success):
        ended_s = record.start_s + record.latency_s
        owners = [i for i, event in enumerate(fired) if event.fired_s <= ended_s]
        if owners:
            failed_by_event[owners[-1]] += 1
        else:
            failed_before += 1
    events = []
    for i, event in enumerate(fired):
        after = fired[i + 1].counters_before if i + 1 < len(fired) else final_counters
        effect_end_s = event.fired_s + event.config.effect_s
        recovered = (
            None
            if targets is None
            else recovery_s(records, effect_end_s, targets, control.recovery_window_s)
        )
        events.append(
            {
                "index": event.index,
                "action": event.config.action,
                "pool": event.config.pool,
                "at_s": event.config.at_s,
                "fired_s": round(event.fired_s, 3),
                "ok": event.ok,
                "detail": event.detail,
                "requests_failed": failed_by_event[i],
                "recovery_s": None if recovered is None else round(recovered, 3),
                "counters": _moved(event.counters_before, after),
            }
        )
    return {"fault_events": events, "failed_before_events": failed_before}
