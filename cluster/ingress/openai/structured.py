"""The request fields that constrain the output, turned into one ``StructuredOutput``.

OpenAI's ``response_format`` (``text``, ``json_object``, ``json_schema`` with its ``schema``) and
vLLM's ``guided_json`` (a schema as an object or JSON text), ``guided_regex``, ``guided_choice``
(a list of strings) and ``guided_grammar`` (EBNF). At most one may be given; a malformed one is a
``SamplingParamsError`` naming the field, so the client gets a 400 that says which. Whether the
schema or regex compiles is the engine's to say (``engine.sampling.grammar``), with the same
field named.
"""

from __future__ import annotations

import json
from typing import Any

from core.errors import SamplingParamsError
from core.sampling import StructuredOutput

GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


def structured_output(body: Any) -> StructuredOutput | None:
    """The one constraint ``body`` asks for, or None."""
    given = [name for name in GUIDED_FIELDS if getattr(body, name, None) is not None]
    response_format = getattr(body, "response_format", None)
    from_format = _from_response_format(response_format) if response_format is not None else None
    if from_format is not None:
        given.insert(0, "response_format")
    if len(given) > 1:
        raise SamplingParamsError(
            f"give one output constraint, not {' and '.join(given)}", param=given[1]
        )
    if from_format is not None:
        return from_format
    if not given:
        return None
    name = given[0]
    value = getattr(body, name)
    if name == "guided_json":
        return StructuredOutput("json", _schema_text(value, name), name)
    if name == "guided_choice":
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(c, str) and c for c in value)
        ):
            raise SamplingParamsError(
                "guided_choice must be a non-empty list of non-empty strings", param=name
            )
        return StructuredOutput("choice", json.dumps(value), name)
    if not isinstance(value, str) or not value:
        raise SamplingParamsError(f"{name} must be a non-empty string", param=name)
    return StructuredOutput("regex" if name == "guided_regex" else "grammar", value, name)


def _from_response_format(value: Any) -> StructuredOutput | None:
    param = "response_format"
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object", "", param)
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise SamplingParamsError(
                "response_format.json_schema must be an object with a schema",
                param="response_format.json_schema",
            )
        return StructuredOutput("json", _schema_text(spec["schema"], param), param)
    raise SamplingParamsError(
        "response_format.type must be one of text, json_object, json_schema",
        param="response_format.type",
    )


def _schema_text(schema: Any, param: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise SamplingParamsError(f"{param} is not valid JSON", param=param) from None
    if not isinstance(schema, dict):
        raise SamplingParamsError(f"{param} must be a JSON schema object", param=param)
    return json.dumps(schema)
