"""``GET /metrics``: the ingress's Prometheus registry, with the replicas' stats fetched fresh
(a stale or failing stats source never breaks the scrape)."""

from __future__ import annotations

import asyncio
import logging

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from cluster.ingress.dispatch.pool_clients import StatsProvider
from cluster.ingress.telemetry.request_metrics import IngressMetrics

logger = logging.getLogger(__name__)


def add_metrics_route(
    app: FastAPI, metrics: IngressMetrics, stats_provider: StatsProvider | None, timeout_s: float
) -> None:
    """``/metrics``; ``stats_provider`` (None: no replica stats) is bounded by ``timeout_s``."""

    @app.get("/metrics")
    async def metrics_text() -> Response:
        if stats_provider is not None:
            try:
                async with asyncio.timeout(timeout_s):
                    metrics.worker_stats.update(await stats_provider())
            except Exception as e:  # stale worker stats must not break the scrape
                logger.warning("worker stats unavailable: %s: %s", type(e).__name__, e)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
