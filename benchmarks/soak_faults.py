"""The soak's fault schedule (``benchmarks/soak.py --faults control-plane``): every
``--fault-every-s`` one piece of the control plane is killed (``cluster.ops.drills``, in turn:
the KV index actor, the stats board, Serve's controller, the ingress replica, the prefill
replica) while the traffic runs, and the time until it is back is measured:

* ``kv_index``: the ingress counted the restart and its view of the index has entries again;
* ``stats_board``: the ingress counted the new board and ``/ready`` answers 200;
* ``serve_controller``: Serve's REST API (which goes through the controller) lists the app
  RUNNING again;
* ``ingress`` / ``prefill_replica``: a RUNNING replica other than the killed one, and ``/ready``
  answering 200.

Every sample of the routers' prefix-hit counters is kept, so the run can also say how long the
decode pool's prefix hit rate took to come back after each index kill
(:func:`hit_rate_recovery_s`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass

import httpx

from cluster.ops.drills import CONTROL_PLANE_FAULTS, ControlPlaneFault, run_drill
from cluster.ops.rest import ServeRest
from cluster.serve.pool_options import INGRESS_DEPLOYMENT, PREFILL_DEPLOYMENT

RECOVERY_TIMEOUT_S = 180.0
_POLL_S = 0.25


@dataclass
class FaultRecord:
    """One injected fault and how long the cluster took to recover from it."""

    kind: ControlPlaneFault
    at_s: float
    """Seconds into the run when it was injected."""
    what: str
    recovery_s: float | None = None
    """None: not back within ``RECOVERY_TIMEOUT_S``."""


def metrics(endpoint: str) -> dict[str, float]:
    """Every sample on ``/metrics``, summed by family name (labels dropped)."""
    values: dict[str, float] = {}
    text = httpx.get(f"{endpoint}/metrics", timeout=10).text
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def ready(endpoint: str) -> bool:
    try:
        return httpx.get(f"{endpoint}/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _running(rest: ServeRest, app: str, deployment: str) -> set[str]:
    details = rest.app_details(app) or {}
    replicas = details.get("deployments", {}).get(deployment, {}).get("replicas", [])
    return {r["actor_name"] for r in replicas if r["state"] == "RUNNING"}


class ControlPlaneFaults:
    """Injects the control-plane faults in turn and measures each recovery."""

    def __init__(self, app: str, endpoint: str, dashboard_url: str) -> None:
        self.app = app
        self.endpoint = endpoint
        self.rest = ServeRest(dashboard_url)
        self.records: list[FaultRecord] = []

    async def run(self, every_s: float, stop_at_s: float, started: float) -> None:
        """Inject a fault every ``every_s`` (the first after half of it) until ``stop_at_s``
        seconds into the run, waiting for each recovery before the next."""
        for index, kind in enumerate(itertools.cycle(CONTROL_PLANE_FAULTS)):
            at_s = every_s * (index + 0.5)
            if at_s >= stop_at_s:
                return
            await asyncio.sleep(max(0.0, started + at_s - time.perf_counter()))
            record = await asyncio.to_thread(self._inject, kind, time.perf_counter() - started)
            self.records.append(record)

    def _inject(self, kind: ControlPlaneFault, at_s: float) -> FaultRecord:
        before = metrics(self.endpoint)
        deployment = {"ingress": INGRESS_DEPLOYMENT, "prefill_replica": PREFILL_DEPLOYMENT}.get(
            kind
        )
        replicas = set() if deployment is None else _running(self.rest, self.app, deployment)
        killed_at = time.monotonic()
        record = FaultRecord(kind, at_s, run_drill(self.app, kind))
        deadline = killed_at + RECOVERY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._recovered(kind, before, replicas, deployment):
                record.recovery_s = time.monotonic() - killed_at
                break
            time.sleep(_POLL_S)
        return record

    def _recovered(
        self,
        kind: ControlPlaneFault,
        before: dict[str, float],
        replicas: set[str],
        deployment: str | None,
    ) -> bool:
        try:
            if kind == "serve_controller":
                app = self.rest.app_details(self.app) or {}
                return bool(app.get("status") == "RUNNING")
            if deployment is not None:
                fresh = _running(self.rest, self.app, deployment) - replicas
                return bool(fresh) and ready(self.endpoint)
            now = metrics(self.endpoint)
        except Exception:  # the piece under test (or the proxy in front of it) is still down
            return False
        if kind == "kv_index":
            restarted = now.get("pdserve:kv_index_restarts_total", 0.0) > before.get(
                "pdserve:kv_index_restarts_total", 0.0
            )
            return restarted and now.get("pdserve:kv_index_num_entries", 0.0) > 0
        restarted = now.get("pdserve:stats_board_restarts_total", 0.0) > before.get(
            "pdserve:stats_board_restarts_total", 0.0
        )
        return restarted and ready(self.endpoint)


def hit_rate_recovery_s(
    samples: list[tuple[float, float, float]], at_s: float, window_s: float = 5.0
) -> float | None:
    """Seconds after ``at_s`` until the prefix hit rate is back to 90% of its rate over the 30 s
    before, having dipped below it (0.0 when it never dipped within a minute): the start of the
    first ``window_s`` window after the dip whose rate is back. ``samples`` are (time, cached
    blocks, prompt blocks) totals. None when there were no hits before or they never came
    back."""

    def rate(start: float, end: float) -> float | None:
        inside = [s for s in samples if start <= s[0] <= end]
        if len(inside) < 2 or inside[-1][2] <= inside[0][2]:
            return None
        return (inside[-1][1] - inside[0][1]) / (inside[-1][2] - inside[0][2])

    baseline = rate(at_s - 30.0, at_s)
    if not baseline:
        return None
    dipped = False
    for t, _, _ in samples:
        if t <= at_s:
            continue
        current = rate(max(at_s, t - window_s), t)
        if current is None:
            continue
        if current < 0.9 * baseline:
            dipped = True
        elif dipped:  # hits were back over the whole window: from its start
            return max(at_s, t - window_s) - at_s
        elif t - at_s > 60.0:
            return 0.0
    return None
