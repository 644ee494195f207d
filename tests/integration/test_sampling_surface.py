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
from tests.cluster_fixtures import ServingApp
from tests.integration.support import BATCHED_TOKENS, KV_BYTES, MAX_MODEL_LEN, MODEL, SERVED_NAME

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

PROMPTS = {
    "disaggregated": "Each pool of a split cluster scales on its own, sized for what it serves.",
    "local-prefill": "Hi",
}
"""A long prompt is prefilled remotely unless decode holds its prefix: each test that needs
the remote path starts it with its own tag (``tagged``), a first KV block no test shares."""


def tagged(path: str, tag: str) -> str:
    """The prompt for ``path``, unique to ``tag`` when it should take the remote path."""
    return f"[{tag}] {PROMPTS[path]}" if path == "disaggregated" else PROMPTS[path]


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
    prompt = tagged(path, "penalties")
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
    messages = [{"role": "user", "content": tagged(path, "schema")}]
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
        model=SERVED_NAME, prompt=tagged(path, "choice"), max_tokens=8, temperature=0.7, seed=3,
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


def offline_logprobs(offline: LLM, prompt: str, n_top: int, max_tokens: int) -> list[float]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                            logprobs=n_top)  # fmt: skip
    out = offline.generate([prompt], sampling_params=params, use_tqdm=False)[0].outputs[0]
    assert out.logprobs is not None
    return [pos[tok].logprob for pos, tok in zip(out.logprobs, out.token_ids, strict=True)]


@pytest.mark.parametrize("path", list(PROMPTS))
def test_logprobs_stream_and_whole_match_the_offline_engine(
    client: openai.OpenAI, offline: LLM, path: str
) -> None:
    prompt = tagged(path, "logprobs")
    expected = offline_logprobs(offline, prompt, 2, 8)
    whole = client.completions.create(
        model=SERVED_NAME, prompt=prompt, max_tokens=8, temperature=0, logprobs=2,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    lp = whole.choices[0].logprobs
    assert lp is not None and lp.token_logprobs == pytest.approx(expected, abs=1e-4)
    # a dict keyed by token text: two ids that decode alike (byte pieces) share one key
    assert all(1 <= len(top) <= 2 for top in lp.top_logprobs or [])
    streamed: list[float] = []
    for chunk in client.completions.create(
        model=SERVED_NAME, prompt=prompt, max_tokens=8, temperature=0, logprobs=2, stream=True,
        extra_body={"ignore_eos": True},
    ):  # fmt: skip
        if chunk.choices and chunk.choices[0].logprobs:
            streamed.extend(chunk.choices[0].logprobs.token_logprobs or [])
    assert streamed == pytest.approx(expected, abs=1e-4)
    chat = client.chat.completions.create(
        model=SERVED_NAME, messages=[{"role": "user", "content": prompt}], max_tokens=4,
        temperature=0, logprobs=True, top_logprobs=3,
    )  # fmt: skip
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 4
    assert all(len(c.top_logprobs) == 3 and c.logprob <= 0 for c in content)


def test_n_best_of_batches_and_echo(client: openai.OpenAI, offline: LLM) -> None:
    prompts = [tagged("disaggregated", "n"), PROMPTS["local-prefill"]]
    out = client.completions.create(
        model=SERVED_NAME, prompt=prompts, max_tokens=6, temperature=1.0, seed=7, n=2,
    )  # fmt: skip
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    for i, prompt in enumerate(prompts):  # choice j of a seeded prompt samples with seed + j
        params = [SamplingParams(max_tokens=6, temperature=1.0, seed=7 + j) for j in range(2)]
        ref = offline.generate([prompt, prompt], sampling_params=params, use_tqdm=False)
        assert [c.text for c in out.choices[2 * i : 2 * i + 2]] == [r.text for r in ref]
    assert out.usage is not None and out.usage.completion_tokens == 4 * 6
    best = client.completions.create(
        model=SERVED_NAME, prompt=prompts[0], max_tokens=4, temperature=1.0, seed=1, n=1,
        best_of=3,
    )  # fmt: skip
    assert len(best.choices) == 1 and best.choices[0].logprobs is None
    echoed = client.completions.create(
        model=SERVED_NAME, prompt=prompts[0], max_tokens=3, temperature=0, echo=True, logprobs=1,
    )  # fmt: skip
    text, lp = echoed.choices[0].text, echoed.choices[0].logprobs
    assert text.startswith(prompts[0]) and lp is not None and lp.token_logprobs is not None
    num_prompt = echoed.usage.prompt_tokens  # type: ignore[union-attr]
    assert lp.token_logprobs[0] is None and len(lp.token_logprobs) == num_prompt + 3
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
