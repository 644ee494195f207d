"""``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter``: LoRA adapters loaded and
unloaded at run time on every replica of both pools (vLLM's routes and bodies).

Load: ``{"lora_name", "lora_path"}`` serves the adapter under ``lora_name`` on the default model
once every replica of its prefill and decode pools loaded it (the :class:`LoRAAdmin` does the
fan-out and rolls back when any replica refuses it: one OpenAI-shaped error, the replica's
typed message — rank, targets, base model, a corrupt file); a name already served is a 400.
Unload: ``{"lora_name"}`` stops serving it everywhere; an unknown name is a 404. Both answer
vLLM's plain-text ``Success: ...`` line. The routes exist when the cluster provides an admin.
"""

from __future__ import annotations

from typing import Protocol

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cluster.ingress.app.openapi import json_body
from cluster.ingress.http.error_responses import error_response, from_validation_error
from cluster.ingress.http.json_body import parse_json_object
from cluster.ingress.lora_adapters import ServedAdapter
from cluster.ingress.model_table import ModelTable
from core.errors import InvalidRequestError, ModelNotFoundError, PdserveError

LOAD_ROUTE = "/v1/load_lora_adapter"
UNLOAD_ROUTE = "/v1/unload_lora_adapter"


class LoRAAdmin(Protocol):
    """What the routes ask of the cluster."""

    async def load(self, adapter: ServedAdapter) -> None:
        """Load ``adapter`` on every replica of its base model's pools, or on none: raises
        the first replica's typed error after unloading it everywhere."""
        ...

    async def unload(self, adapter: ServedAdapter) -> None:
        """Unload ``adapter`` from every replica of its base model's pools."""
        ...


class LoadLoRAAdapterRequest(BaseModel):
    """vLLM's load body."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(..., min_length=1, pattern=r"^[^\s/:]+$")
    lora_path: str = Field(..., min_length=1)


class UnloadLoRAAdapterRequest(BaseModel):
    """vLLM's unload body (``lora_int_id`` accepted and ignored: names identify adapters)."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(..., min_length=1)
    lora_int_id: int | None = None


def add_lora_routes(app: FastAPI, table: ModelTable, admin: LoRAAdmin | None) -> None:
    """Register both routes over ``table``'s adapters (nothing when ``admin`` is None)."""
    if admin is None:
        return

    async def load(request: Request) -> Response:
        try:
            body = LoadLoRAAdapterRequest.model_validate(parse_json_object(await request.body()))
            name = body.lora_name
            if table.adapters.find(name) is not None or name in table.names():
                raise InvalidRequestError(
                    f"The lora adapter '{name}' has already been loaded.", param="lora_name"
                )
            adapter = ServedAdapter(name, table.default.name, body.lora_path)
            await admin.load(adapter)
            table.adapters.add(adapter)
        except ValidationError as e:
            return error_response(from_validation_error(e))
        except PdserveError as e:
            return error_response(e)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(request: Request) -> Response:
        try:
            body = UnloadLoRAAdapterRequest.model_validate(parse_json_object(await request.body()))
            adapter = table.adapters.find(body.lora_name)
            if adapter is None:
                raise ModelNotFoundError(
                    f"The lora adapter '{body.lora_name}' cannot be found.", param="lora_name"
                )
            await admin.unload(adapter)
            table.adapters.remove(adapter.name)
        except ValidationError as e:
            return error_response(from_validation_error(e))
        except PdserveError as e:
            return error_response(e)
        return PlainTextResponse(f"Success: LoRA adapter '{adapter.name}' removed successfully.")

    app.add_api_route(
        LOAD_ROUTE, load, methods=["POST"], openapi_extra=json_body(LoadLoRAAdapterRequest)
    )
    app.add_api_route(
        UNLOAD_ROUTE, unload, methods=["POST"], openapi_extra=json_body(UnloadLoRAAdapterRequest)
    )
