"""The ingress's watch on Serve's controller: restarts and outages, for ``/metrics``.

Serve's controller is not on the request path — the proxy and the handles keep routing to the
replicas they know while it is down — but while it is gone nothing scales, no replica is
replaced and ``pdserve scale`` waits. Ray restarts a killed controller in a new process, so the
watch asks it for its pid every ``refresh_s``: a new pid is a restart
(``pdserve:serve_controller_restarts_total``), a probe that fails or times out an outage
(``pdserve:serve_controller_unavailable_total``).
"""

from __future__ import annotations

import asyncio
import logging

import ray
from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

logger = logging.getLogger(__name__)


class ControllerWatch:
    """Counts Serve controller restarts and failed probes, refreshed in the background."""

    def __init__(self, refresh_s: float = 2.0, timeout_s: float = 2.0) -> None:
        self._refresh_s = refresh_s
        self._timeout_s = timeout_s
        self._pid: int | None = None
        self._task: asyncio.Task[None] | None = None
        self.restarts_total = 0
        self.unavailable_total = 0

    def start(self) -> None:
        """Begin probing on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._probe_forever())

    def stop(self) -> None:
        """Stop probing."""
        if self._task is not None:
            self._task.cancel()

    async def probe(self) -> None:
        """Ask the controller for its pid once; count a restart or an outage."""
        try:
            controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
            pid: int = await asyncio.wait_for(controller.get_pid.remote(), self._timeout_s)
        except Exception as e:  # gone, restarting, or too slow to answer: an outage
            self.unavailable_total += 1
            logger.warning("Serve controller unavailable: %s: %s", type(e).__name__, e)
            return
        if self._pid is not None and pid != self._pid:
            self.restarts_total += 1
            logger.warning("Serve controller restarted (pid %s -> %s)", self._pid, pid)
        self._pid = pid

    async def _probe_forever(self) -> None:
        while True:
            await self.probe()
            await asyncio.sleep(self._refresh_s)
