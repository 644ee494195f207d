"""OpenAI's response_format and vLLM's guided_* fields become one typed StructuredOutput; every
malformed or conflicting one is a SamplingParamsError naming its field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cluster.ingress.openai.schemas import ChatCompletionRequest, CompletionRequest
from cluster.ingress.openai.structured import structured_output
from core.errors import SamplingParamsError
from core.sampling import StructuredOutput

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
NAMED = {"name": "x", "schema": SCHEMA}


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [], **fields})


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}},
         StructuredOutput("json_object", "", "response_format")),
        ({"response_format": {"type": "json_schema", "json_schema": NAMED}},
         StructuredOutput("json", json.dumps(SCHEMA), "response_format")),
        ({"guided_json": SCHEMA}, StructuredOutput("json", json.dumps(SCHEMA), "guided_json")),
        ({"guided_json": json.dumps(SCHEMA)},
         StructuredOutput("json", json.dumps(SCHEMA), "guided_json")),
        ({"guided_choice": ["a", "b"]}, StructuredOutput("choice", '["a", "b"]', "guided_choice")),
        ({"guided_regex": "[0-9]+"}, StructuredOutput("regex", "[0-9]+", "guided_regex")),
        ({"guided_grammar": 'root ::= "x"'},
         StructuredOutput("grammar", 'root ::= "x"', "guided_grammar")),
    ],
)  # fmt: skip
def test_each_field_maps_to_its_constraint(fields: dict, expected: StructuredOutput | None) -> None:
    assert structured_output(chat(**fields)) == expected
    assert structured_output(CompletionRequest.model_validate(fields)) == expected


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"response_format": "json"}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"guided_json": "{oops"}, "guided_json"),
        ({"guided_json": [1]}, "guided_json"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_choice": "a"}, "guided_choice"),
        ({"guided_regex": 5}, "guided_regex"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ],
)
def test_bad_or_conflicting_constraints_name_the_field(fields: dict, param: str) -> None:
    with pytest.raises(SamplingParamsError) as err:
        structured_output(chat(**fields))
    assert err.value.param == param
