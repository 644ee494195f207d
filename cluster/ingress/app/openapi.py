"""``/openapi.json`` that describes the request bodies.

The generation and tokenizer routes read their bodies themselves (so a bad body becomes an
OpenAI-shaped 400 naming the field, not FastAPI's 422), which leaves FastAPI nothing to describe.
:func:`json_body` gives such a route the ``requestBody`` of its pydantic model, and
:func:`describe_bodies` puts those models' JSON schemas under ``components.schemas``, so clients
and fuzzers (schemathesis) read the real shapes from the running server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

_REF = "#/components/schemas/{model}"


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """The ``openapi_extra`` of a route whose JSON body is ``model``."""
    schema = {"$ref": _REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def describe_bodies(app: FastAPI, models: Sequence[type[BaseModel]]) -> None:
    """Have ``app``'s OpenAPI document carry ``models`` (and the models they nest)."""

    def generate() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                schema = model.model_json_schema(ref_template=_REF)
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = generate  # type: ignore[method-assign]
