"""``GET /health`` and ``GET /ready``: the pools' state as the ingress sees it, per model.

``/health`` always answers 200 with the state; ``/ready`` answers 200 only when a request sent
now is served by every model (with local fallback, decode alone serves every prompt, so a
missing prefill pool only shows as ``degraded``), else 503. Both bodies carry a ``reason`` in
words (what serves each model now, or what is missing). Both are public (no API key).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from cluster.ingress.http.request_gate import RequestGate
from cluster.ingress.model_table import ModelHealth, ModelTable


def add_probe_routes(app: FastAPI, table: ModelTable, gate: RequestGate) -> None:
    """``/health`` and ``/ready`` over ``table``'s routes and the drain flag of ``gate``."""

    @app.get("/health")
    async def health() -> Response:
        status = _status(table, gate)
        status.pop("ready")
        return JSONResponse({"status": "ok", **status})

    @app.get("/ready")
    async def ready() -> Response:
        status = _status(table, gate)
        is_ready = status.pop("ready")
        body = {"status": "ready" if is_ready else "not_ready", **status}
        return JSONResponse(body, status_code=200 if is_ready else 503)


def _status(table: ModelTable, gate: RequestGate) -> dict[str, Any]:
    """The probes' body: each model's health computed once."""
    health = {r.name: r.health() for r in table.routes}
    status: dict[str, Any] = {
        "draining": gate.draining,
        "prefill": all(h.prefill for h in health.values()),
        "decode": all(h.decode for h in health.values()),
        "degraded": ["prefill_unavailable"] if any(h.degraded for h in health.values()) else [],
        "ready": not gate.draining and all(h.ready for h in health.values()),
        "reason": _reason(health, gate.draining),
    }
    if len(health) > 1:
        status["models"] = {
            name: {"prefill": h.prefill, "decode": h.decode, "reason": h.reason}
            for name, h in health.items()
        }
    return status


def _reason(health: dict[str, ModelHealth], draining: bool) -> str:
    """The body's ``reason``: draining, else the one model's reason, else each model's that is
    not plainly served (``name: reason``) or that every model is."""
    if draining:
        return "draining: new requests are refused"
    if len(health) == 1:
        return next(iter(health.values())).reason
    notes = [f"{name}: {h.reason}" for name, h in health.items() if not (h.ready and h.prefill)]
    return "; ".join(notes) or "every model's prefill and decode replicas are serving"
