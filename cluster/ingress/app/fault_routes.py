"""``POST /admin/faults``: faults a load test injects into a running cluster, on purpose.

Served only when ``server.fault_injection`` is true (otherwise the route does not exist); API
keys apply as on every other route. Body: ``{"action": "kill_replica", "pool": "decode"}`` kills
the pool's busiest live replica (Serve then replaces it; in-flight streams migrate);
``{"action": "transfer_fail" | "transfer_stall", "duration_s": 5}`` makes every prefill
replica's KV exports abort at the first chunk, or wait ``stall_per_chunk_s`` before each chunk,
for ``duration_s``; ``{"action": "transfer_clear"}`` ends them at once. The answer names what
was done (``{"action", "detail"}``); a bad body is an OpenAI-shaped 400 naming the field. The
work itself is the :class:`FaultAdmin` the Serve deployment provides.
"""

from __future__ import annotations

from typing import Literal, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cluster.ingress.app.openapi import json_body
from cluster.ingress.http.error_responses import error_response, from_validation_error
from cluster.ingress.http.json_body import parse_json_object
from core.errors import PdserveError

FAULTS_ROUTE = "/admin/faults"


class FaultAdmin(Protocol):
    """What the route asks of the cluster."""

    async def kill_replica(self, pool: str) -> str:
        """Kill the busiest live replica of ``pool``; returns which one."""
        ...

    async def transfer_faults(self, fail: bool, stall_per_chunk_s: float, duration_s: float) -> str:
        """Make the prefill pool's exports fail (or stall) for ``duration_s``; what was set."""
        ...

    async def clear_transfer_faults(self) -> str:
        """End the prefill pool's transfer faults now."""
        ...


class FaultRequest(BaseModel):
    """One fault to inject now."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["kill_replica", "transfer_fail", "transfer_stall", "transfer_clear"]
    pool: Literal["prefill", "decode"] | None = None
    duration_s: float = Field(5.0, gt=0.0, le=3600.0)
    stall_per_chunk_s: float = Field(0.5, gt=0.0, le=60.0)

    @model_validator(mode="after")
    def _kill_names_a_pool(self) -> FaultRequest:
        if self.action == "kill_replica" and self.pool is None:
            raise ValueError("kill_replica needs a pool (prefill or decode)")
        return self


def add_fault_routes(app: FastAPI, admin: FaultAdmin | None) -> None:
    """Register ``POST /admin/faults`` on ``app`` (nothing when ``admin`` is None: off)."""
    if admin is None:
        return

    async def inject(request: Request) -> Response:
        try:
            body = FaultRequest.model_validate(parse_json_object(await request.body()))
            if body.action == "kill_replica":
                assert body.pool is not None
                detail = await admin.kill_replica(body.pool)
            elif body.action == "transfer_clear":
                detail = await admin.clear_transfer_faults()
            else:
                fail = body.action == "transfer_fail"
                detail = await admin.transfer_faults(fail, body.stall_per_chunk_s, body.duration_s)
        except ValidationError as e:
            return error_response(from_validation_error(e))
        except PdserveError as e:
            return error_response(e)
        return JSONResponse({"action": body.action, "detail": detail})

    app.add_api_route(FAULTS_ROUTE, inject, methods=["POST"], openapi_extra=json_body(FaultRequest))
