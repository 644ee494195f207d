"""Structured output: the random-weight built-in model emits valid JSON for random schemas,
one of the choices, a regex match; bad constraints are typed errors naming their field."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import jsonschema
import pytest

from core.errors import SamplingParamsError
from core.sampling import SamplingParams, StructuredOutput
from engine import LLM


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("builtin:tiny-llama", max_model_len=1024)


def random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """An object schema of moderate depth: scalars, enums, bounded strings and arrays."""
    properties: dict[str, Any] = {}
    for i in range(rng.randint(1, 4)):
        kind = rng.choice(["integer", "boolean", "string", "enum", "array", "object"])
        if kind == "object" and depth < 2:
            properties[f"k{i}"] = random_schema(rng, depth + 1)
        elif kind == "array":
            items = {"type": rng.choice(["integer", "boolean"])}
            properties[f"k{i}"] = {"type": "array", "items": items, "maxItems": 3}
        elif kind == "string":
            properties[f"k{i}"] = {"type": "string", "maxLength": 6}
        elif kind == "enum":
            properties[f"k{i}"] = {"enum": ["red", "green", "blue"][: rng.randint(1, 3)]}
        else:
            properties[f"k{i}"] = {"type": kind if kind != "object" else "integer"}
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def generate(llm: LLM, spec: StructuredOutput, seed: int, max_tokens: int = 400) -> Any:
    params = SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens,
                            structured_output=spec)  # fmt: skip
    return llm.generate("Answer:", sampling_params=params, use_tqdm=False)[0].outputs[0]


def test_random_weights_emit_valid_json_for_twenty_random_schemas(llm: LLM) -> None:
    rng = random.Random(0)
    for seed in range(20):
        schema = random_schema(rng)
        out = generate(llm, StructuredOutput("json", json.dumps(schema)), seed)
        assert out.finish_reason == "stop", (schema, out.text)
        jsonschema.validate(json.loads(out.text), schema)


def test_json_object_choice_and_regex(llm: LLM) -> None:
    out = generate(llm, StructuredOutput("json_object"), seed=3)
    assert out.finish_reason == "stop" and isinstance(json.loads(out.text), dict)
    choices = ["yes", "no", "maybe so"]
    for seed in range(5):
        out = generate(llm, StructuredOutput("choice", json.dumps(choices), "guided_choice"), seed)
        assert out.text in choices
    out = generate(llm, StructuredOutput("regex", r"[a-c]{2}-\d{3}", "guided_regex"), seed=1)
    assert re.fullmatch(r"[a-c]{2}-\d{3}", out.text)


def test_constrained_and_free_rows_share_a_batch(llm: LLM) -> None:
    free = SamplingParams(temperature=0.0, max_tokens=12)
    spec = StructuredOutput("choice", '["alpha", "beta"]', "guided_choice")
    constrained = SamplingParams(temperature=0.0, max_tokens=12, structured_output=spec)
    alone = llm.generate("Hi", sampling_params=free, use_tqdm=False)[0].outputs[0].token_ids
    outs = llm.generate(["Hi", "Hi"], sampling_params=[free, constrained], use_tqdm=False)
    assert outs[0].outputs[0].token_ids == alone
    assert outs[1].outputs[0].text in ("alpha", "beta")


@pytest.mark.parametrize(
    ("spec", "param"),
    [
        (StructuredOutput("json", "{not json", "response_format"), "response_format"),
        (StructuredOutput("json", '{"type": "nonsense"}', "guided_json"), "guided_json"),
        (StructuredOutput("regex", "(unclosed", "guided_regex"), "guided_regex"),
        (StructuredOutput("choice", "[]", "guided_choice"), "guided_choice"),
        (StructuredOutput("grammar", "root ::= ", "guided_grammar"), "guided_grammar"),
    ],
)
def test_bad_constraints_name_their_field(llm: LLM, spec: StructuredOutput, param: str) -> None:
    with pytest.raises(SamplingParamsError) as err:
        generate(llm, spec, seed=0)
    assert err.value.param == param
    assert generate(llm, StructuredOutput("json_object"), seed=0).finish_reason == "stop"


def test_the_grammar_decides_where_output_ends(llm: LLM) -> None:
    spec = StructuredOutput("choice", '["ab", "cd"]', "guided_choice")
    held = SamplingParams(temperature=0.0, max_tokens=20, min_tokens=10, structured_output=spec)
    out = llm.generate("x", sampling_params=held, use_tqdm=False)[0].outputs[0]
    assert out.text in ("ab", "cd") and out.finish_reason == "stop"
    free_after = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True,
                                structured_output=spec)  # fmt: skip
    out = llm.generate("x", sampling_params=free_after, use_tqdm=False)[0].outputs[0]
    assert out.text[:2] in ("ab", "cd") and len(out.token_ids) == 6
