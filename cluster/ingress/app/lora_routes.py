"""``POST /v1/load_lora_adapter`` and ``POST /v1/unload_lora_adapter``: LoRA adapters loaded and
unloaded at run time on every replica of both pools (vLLM's routes and bodies).

Load: ``{"lora_name", "lora_path"}`` (plus ``base_model_name``, as in ``model.lora_modules``)
serves the adapter under ``lora_name`` on the model ``base_model_name`` names, else on the only
model that serves adapters (several: a 400 naming them), once every replica of its prefill and
decode pools loaded it (the :class:`LoRAAdmin` does the fan-out and rolls back when any replica
refuses it: one OpenAI-shaped error, the replica's typed message — rank, targets, base model, a
corrupt file); a name already served is a 400. Unload: ``{"lora_name"}`` stops serving it
everywhere; an unknown name is a 404. Both answer vLLM's plain-text ``Success: ...`` line. The
admin is also the registry every ingress reads (``cluster.ingress.lora_adapters``), so the other
ingress replicas follow. The routes exist when the cluster provides an admin.
"""

from __future__ import annotations

from typing import Protocol

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cluster.ingress.app.openapi import json_body
from cluster.ingress.http.error_responses import error_response, from_validation_error
from cluster.ingress.http.json_body import parse_json_object
from cluster.ingress.lora_adapters import AdapterRegistry, ServedAdapter
from cluster.ingress.model_table import ModelTable
from core.errors import InvalidRequestError, ModelNotFoundError, PdserveError

LOAD_ROUTE = "/v1/load_lora_adapter"
UNLOAD_ROUTE = "/v1/unload_lora_adapter"


class LoRAAdmin(AdapterRegistry, Protocol):
    """What the routes ask of the cluster (which also keeps the registry of what it loaded)."""

    @property
    def bases(self) -> tuple[str, ...]:
        """The canonical served names of the models that serve adapters, in the YAML's order."""
        ...

    async def load(self, adapter: ServedAdapter) -> None:
        """Load ``adapter`` on every replica of its base model's pools, or on none: raises
        the first replica's typed error after unloading it everywhere."""
        ...

    async def unload(self, adapter: ServedAdapter) -> None:
        """Unload ``adapter`` from every replica of its base model's pools."""
        ...


class LoadLoRAAdapterRequest(BaseModel):
    """vLLM's load body, plus ``base_model_name`` (``model.lora_modules``' field)."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(..., min_length=1, pattern=r"^[^\s/:]+$")
    lora_path: str = Field(..., min_length=1)
    base_model_name: str | None = Field(
        None,
        min_length=1,
        description="A served name of the model the adapter belongs to; None: the only model "
        "that serves adapters.",
    )


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
            await table.sync(name)
            if table.adapters.find(name) is not None or name in table.names():
                raise InvalidRequestError(
                    f"The lora adapter '{name}' has already been loaded.", param="lora_name"
                )
            base = base_of(table, admin, body.base_model_name)
            adapter = ServedAdapter(name, base, body.lora_path)
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
            await table.sync(body.lora_name)
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


def base_of(table: ModelTable, admin: LoRAAdmin, base_model_name: str | None) -> str:
    """The canonical name of the model a runtime adapter attaches to: the one
    ``base_model_name`` names, else the only one serving adapters; a 400 naming the choices."""
    choices = ", ".join(admin.bases)
    if base_model_name is None:
        if len(admin.bases) == 1:
            return admin.bases[0]
        raise InvalidRequestError(
            f"several models serve LoRA adapters, name one as base_model_name: {choices}",
            param="base_model_name",
        )
    route = table.served(base_model_name)
    if route is None or route.name not in admin.bases:
        raise InvalidRequestError(
            f"base_model_name {base_model_name!r} is not a model serving LoRA adapters; "
            f"choose one of: {choices}",
            param="base_model_name",
        )
    return route.name
