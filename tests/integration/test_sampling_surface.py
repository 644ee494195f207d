"""Penalties, logit_bias and structured output through the served app with the official
``openai`` client, on the disaggregated path (the prefill samples the first token under the
same bias, penalties and grammar, decode continues) and the local-prefill path: greedy text
equals the offline engine's; constrained output parses; a schema that does not compile is a
400 naming its field, and the server keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import openai
import pytest

from core.sampling import SamplingParams, StructuredOutput
from engine import LLM
from tests.integration.conftest import ServingApp
from tests.integration.support import BATCHED_TOKENS, KV_BYTES, MAX_MODEL_LEN, MODEL, SERVED_NAME

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

PROMPTS = {
    "disaggregated": "Disaggregated serving splits prefill and decode onto separate pools.",
    "local-prefill": "Hi",
}
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 5}, "n": {"type": "integer"}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
PENALTIES = {"presence_penalty": 0.6, "frequency_penalty": 0.4, "repetition_penalty": 1.3}


@pytest.fixture(scope="module")
def offline() -> Iterator[LLM]:
    yield LLM(MODEL, dtype="float32", max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=KV_BYTES,
              max_num_batched_tokens=BATCHED_TOKENS, max_num_seqs=8)  # fmt: skip


@pytest.fixture(scope="module")
def client(serving_app: ServingApp) -> openai.OpenAI:
    return openai.OpenAI(base_url=serving_app.url("/v1"), api_key="unused", timeout=120)


@pytest.mark.parametrize("path", list(PROMPTS))
def test_penalties_and_bias_match_the_offline_engine(
    client: openai.OpenAI, offline: LLM, path: str
) -> None:
    prompt = PROMPTS[path]
    bias = {"7": 4.0, "9": -100.0}
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True,
                            logit_bias={7: 4.0, 9: -100.0}, **PENALTIES)  # fmt: skip
    reference = offline.generate([prompt], sampling_params=params, use_tqdm=False)[0]
    out = client.completions.create(
        model=SERVED_NAME, prompt=prompt, max_tokens=16, temperature=0,
        presence_penalty=0.6, frequency_penalty=0.4, logit_bias=bias,
        extra_body={"repetition_penalty": 1.3, "ignore_eos": True},
    )  # fmt: skip
    assert out.choices[0].text == reference.outputs[0].text


@pytest.mark.parametrize("path", list(PROMPTS))
def test_structured_output_parses_and_matches_the_offline_engine(
    client: openai.OpenAI, offline: LLM, path: str
) -> None:
    messages = [{"role": "user", "content": PROMPTS[path]}]
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}
    out = client.chat.completions.create(
        model=SERVED_NAME, messages=messages, max_tokens=64, temperature=0,
        response_format=response_format,  # type: ignore[arg-type]
    )  # fmt: skip
    text = out.choices[0].message.content or ""
    jsonschema.validate(json.loads(text), SCHEMA)
    spec = StructuredOutput("json", json.dumps(SCHEMA))
    params = SamplingParams(max_tokens=64, temperature=0.0, structured_output=spec)
    reference = offline.chat(messages, sampling_params=params, use_tqdm=False)[0]
    assert text == reference.outputs[0].text
    choice = client.completions.create(
        model=SERVED_NAME, prompt=PROMPTS[path], max_tokens=8, temperature=0.7, seed=3,
        extra_body={"guided_choice": ["left", "right"]},
    )  # fmt: skip
    assert choice.choices[0].text in ("left", "right")


def test_a_schema_that_does_not_compile_is_a_400_naming_the_field(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(
            model=SERVED_NAME, prompt=PROMPTS["disaggregated"], max_tokens=4,
            extra_body={"guided_json": {"type": "no-such-type"}},
        )  # fmt: skip
    assert err.value.body["param"] == "guided_json", err.value.body  # type: ignore[index]
    ok = client.completions.create(model=SERVED_NAME, prompt="Hi", max_tokens=2)
    assert ok.choices[0].text is not None
