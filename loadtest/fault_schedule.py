"""Fire a load test's fault events on time and read the server's counters around them.

:class:`FaultSchedule` runs beside the requests: at each event's ``at_s`` it scrapes the
server's ``/metrics`` (the counters before), then fires the event: kills and transfer faults
through ``POST /admin/faults`` (``server.fault_injection`` must be on), a scale by running
``pdserve scale`` (a separate process: the load tester never imports Ray). When the run ends
it scrapes once more, so each event's counter deltas run up to the next event or the end.
An event that could not be fired is recorded with its error; the run goes on.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadtest.clock import now_s
from loadtest.config import FaultControlConfig, FaultEventConfig

Counters = dict[str, float]
"""``name{label="value",...}`` -> value, for every ``pdserve:`` counter sample."""

_SCALE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class FiredEvent:
    """One event as it happened: when (seconds from the run's start), whether it worked."""

    index: int
    config: FaultEventConfig
    fired_s: float
    ok: bool
    detail: str
    counters_before: Counters = field(default_factory=dict)


def parse_counters(text: str) -> Counters:
    """The ``pdserve:`` counters of a Prometheus text exposition: the ``*_total`` samples of
    every family its ``# TYPE`` lines declare a counter (the parser files a colon-named
    counter's samples under a family of their own, so the declarations are read here)."""
    declared = {
        parts[2].removesuffix("_total") + "_total"
        for line in text.splitlines()
        if line.startswith("# TYPE ") and len(parts := line.split()) == 4 and parts[3] == "counter"
    }
    counters: Counters = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not sample.name.startswith("pdserve:") or sample.name not in declared:
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            key = f"{sample.name}{{{labels}}}"
            counters[key] = counters.get(key, 0.0) + sample.value
    return counters


class FaultSchedule:
    """The events of one run, fired against ``base_url``."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        base_url: str,
        events: Sequence[FaultEventConfig],
        control: FaultControlConfig,
        api_key: str | None = None,
    ) -> None:
        self._http = http
        self._base_url = base_url.rstrip("/")
        self._events = sorted(events, key=lambda e: e.at_s)
        self._control = control
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.fired: list[FiredEvent] = []
        self.final_counters: Counters = {}

    async def run(self, started_s: float) -> None:
        """Fire every event at its time (``started_s``: the run's start on the loop clock)."""
        for index, event in enumerate(self._events):
            await asyncio.sleep(max(0.0, started_s + event.at_s - now_s()))
            before = await self.counters()
            fired_s = now_s() - started_s
            try:
                ok, detail = await self._fire(event)
            except (httpx.HTTPError, OSError) as e:
                ok, detail = False, f"{type(e).__name__}: {e}"
            self.fired.append(FiredEvent(index, event, fired_s, ok, detail, before))

    async def finish(self) -> None:
        """Read the counters once the requests are done."""
        self.final_counters = await self.counters()

    async def counters(self) -> Counters:
        """The server's counters now (empty when ``/metrics`` cannot be read)."""
        try:
            response = await self._http.get(f"{self._base_url}/metrics", headers=self._headers)
            response.raise_for_status()
        except httpx.HTTPError:
            return {}
        return parse_counters(response.text)

    async def _fire(self, event: FaultEventConfig) -> tuple[bool, str]:
        if event.action == "scale":
            return await self._scale(event)
        body: dict[str, object] = {"action": event.action}
        if event.action == "kill_replica":
            body["pool"] = event.pool
        else:
            body |= {"duration_s": event.duration_s, "stall_per_chunk_s": event.stall_per_chunk_s}
        response = await self._http.post(
            f"{self._base_url}/admin/faults", json=body, headers=self._headers
        )
        if response.status_code != 200:
            return False, f"HTTP {response.status_code}: {response.text[:300]}"
        return True, str(response.json().get("detail", ""))

    async def _scale(self, event: FaultEventConfig) -> tuple[bool, str]:
        args = ["scale", "--app", self._control.app_name, f"--{event.pool}", str(event.replicas)]
        if self._control.dashboard_url:
            args += ["--dashboard", self._control.dashboard_url]
            args += ["--address", self._control.ray_address]
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cluster.ops.cli", *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:
            output, _ = await asyncio.wait_for(process.communicate(), _SCALE_TIMEOUT_S)
        except TimeoutError:
            process.kill()
            await process.wait()
            return False, f"pdserve scale did not finish in {_SCALE_TIMEOUT_S:g} s"
        text = output.decode(errors="replace").strip()
        return process.returncode == 0, text[-300:]
