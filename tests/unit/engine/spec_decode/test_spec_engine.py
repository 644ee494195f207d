"""Speculative decoding end to end on the built-in tiny models, offline: greedy output with
drafts equals the output without them token for token, whatever ends the request."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from core.errors import ConfigError
from core.sampling import SamplingParams, StructuredOutput
from engine.llm import LLM
from engine.outputs import RequestOutput

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 1,
    # every step drafts what its n-grams give, whatever the step timings (test_payoff*.py
    # covers the rule that pauses drafts which do not pay)
    "pause_unprofitable_drafts": False,
}
PROMPTS = [
    "one two three one two three one two three one two",
    "a b c d e f a b c d e f a b c d e f a b",
    "the cat sat on the mat. the cat sat on the mat. the cat",
    "hello, how are you today?",
]
MODELS = ["builtin:tiny-llama", "builtin:tiny-moe"]


def _llm(model: str, **kw: Any) -> LLM:
    return LLM(model, max_model_len=512, kv_cache_memory_bytes=8 << 20, **kw)


@pytest.fixture(scope="module")
def pairs() -> Iterator[Callable[[str], tuple[LLM, LLM]]]:
    """``pairs(model)``: the same model without and with n-gram drafts, built once."""
    built: dict[str, tuple[LLM, LLM]] = {}

    def get(model: str) -> tuple[LLM, LLM]:
        if model not in built:
            built[model] = (_llm(model), _llm(model, speculative_config=NGRAM))
        return built[model]

    yield get
    for base, spec in built.values():
        base.shutdown()
        spec.shutdown()


@pytest.fixture(params=MODELS)
def pair(
    request: pytest.FixtureRequest, pairs: Callable[[str], tuple[LLM, LLM]]
) -> tuple[LLM, LLM]:
    """One model's pair, for each built-in model."""
    return pairs(request.param)


def _generate(
    llm: LLM, params: SamplingParams, prompts: list[str] = PROMPTS
) -> list[RequestOutput]:
    outputs = llm.generate(prompts, params, use_tqdm=False)
    scheduler = llm.engine.scheduler
    scheduler.check_integrity()
    stats = scheduler.stats()
    assert stats.num_used_blocks == 0  # every block of every request given back
    assert not scheduler.has_unfinished()
    return outputs


def _same(a: list[RequestOutput], b: list[RequestOutput]) -> None:
    for x, y in zip(a, b, strict=True):
        assert len(x.outputs) == len(y.outputs)
        for cx, cy in zip(x.outputs, y.outputs, strict=True):
            assert cy.token_ids == cx.token_ids
            assert cy.text == cx.text
            assert cy.finish_reason == cx.finish_reason
            assert cy.stop_reason == cx.stop_reason


def _accepted(llm: LLM) -> int:
    return llm.engine.scheduler.stats().spec_decode.num_accepted_tokens


@pytest.mark.parametrize(
    ("model", "max_tokens"),
    [(MODELS[0], 1), (MODELS[0], 6), (MODELS[0], 13), (MODELS[0], 48), (MODELS[1], 16)],
)
def test_greedy_equals_no_speculation(
    pairs: Callable[[str], tuple[LLM, LLM]], model: str, max_tokens: int
) -> None:
    base, spec = pairs(model)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    before = _accepted(spec)
    outputs = _generate(spec, params)
    _same(_generate(base, params), outputs)
    assert all(len(o.outputs[0].token_ids) == max_tokens for o in outputs)
    if max_tokens >= 16:
        assert _accepted(spec) > before  # drafts were accepted, so verify rows really ran


def test_stop_strings_and_eos_end_at_the_same_token(pair: tuple[LLM, LLM]) -> None:
    base, spec = pair
    free = _generate(base, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    for output in free:
        text = output.outputs[0].text
        stop = text[len(text) // 2 : len(text) // 2 + 2]  # a string it certainly meets
        params = SamplingParams(temperature=0.0, max_tokens=40, stop=(stop,))
        _same(
            _generate(base, params, [output.prompt or ""]),
            _generate(spec, params, [output.prompt or ""]),
        )


def test_penalties_min_tokens_and_logprobs_as_without_speculation(pair: tuple[LLM, LLM]) -> None:
    base, spec = pair
    params = SamplingParams(
        temperature=0.0,
        max_tokens=30,
        min_tokens=10,
        presence_penalty=0.3,
        repetition_penalty=1.1,
        logprobs=2,
    )
    expected, got = _generate(base, params), _generate(spec, params)
    _same(expected, got)
    for x, y in zip(expected, got, strict=True):
        assert x.outputs[0].logprobs is not None and y.outputs[0].logprobs is not None
        assert len(y.outputs[0].logprobs) == len(x.outputs[0].logprobs)
        for px, py in zip(x.outputs[0].logprobs, y.outputs[0].logprobs, strict=True):
            assert py.keys() == px.keys()
            for token_id, entry in px.items():
                assert py[token_id].logprob == pytest.approx(entry.logprob, abs=1e-4)


def test_n_sequences_each_equal_no_speculation(pair: tuple[LLM, LLM]) -> None:
    base, spec = pair
    params = SamplingParams(temperature=0.0, max_tokens=20, n=3, ignore_eos=True)
    _same(_generate(base, params), _generate(spec, params))


def test_seeded_sampling_with_drafts_is_reproducible_and_frees_its_blocks() -> None:
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=24, seed=5, n=2, ignore_eos=True)
    with _llm("builtin:tiny-llama", speculative_config=NGRAM) as spec:
        first = _generate(spec, params)
        second = _generate(spec, params)
        assert spec.engine.scheduler.stats().spec_decode.num_drafts > 0
    _same(first, second)
    assert all(len(c.token_ids) == 24 for o in first for c in o.outputs)


def test_structured_output_requests_do_not_speculate() -> None:
    params = SamplingParams(
        temperature=0.0,
        max_tokens=12,
        structured_output=StructuredOutput("choice", '["yes yes yes", "no"]'),
    )
    with _llm("builtin:tiny-llama", speculative_config=NGRAM) as spec:
        outputs = _generate(spec, params, ["yes yes yes yes yes"])
        assert spec.engine.scheduler.stats().spec_decode.num_drafts == 0
    assert outputs[0].outputs[0].text in ("yes yes yes", "no")


def test_a_bad_speculative_config_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        LLM("builtin:tiny-llama", speculative_config={"method": "ngram", "k": 3})
    assert "num_speculative_tokens: Field required" in info.value.message
    assert "k: Extra inputs are not permitted" in info.value.message
    assert "\n" not in info.value.message


class _FailingVerifier:
    """Stands in for the engine's rejection sampler: raises on batches of more than
    ``max_batch`` requests (never: ``max_batch=-1``), else verifies as the real one does."""

    def __init__(self, real: Any, max_batch: int) -> None:
        self.real, self.max_batch = real, max_batch

    def verify(self, logits: Any, requests: Any) -> Any:
        if len(requests) > self.max_batch:
            raise RuntimeError("verification broke")
        return self.real.verify(logits, requests)


def test_a_verification_that_fails_only_in_batch_is_retried_per_request(
    pairs: Callable[[str], tuple[LLM, LLM]], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, spec = pairs(MODELS[0])
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    speculation = spec.engine.speculation
    assert speculation is not None
    monkeypatch.setattr(speculation, "rejection", _FailingVerifier(speculation.rejection, 1))
    _same(_generate(base, params), _generate(spec, params))


def test_a_verification_that_always_fails_fails_its_requests_alone(
    pairs: Callable[[str], tuple[LLM, LLM]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _base, spec = pairs(MODELS[0])
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    speculation = spec.engine.speculation
    assert speculation is not None
    monkeypatch.setattr(speculation, "rejection", _FailingVerifier(speculation.rejection, -1))
    before = spec.engine.scheduler.stats().spec_decode.num_drafts
    outputs = _generate(spec, params)  # every block given back, checked inside
    failed = [o for o in outputs if o.outputs[0].finish_reason == "error"]
    assert failed
    assert all("verifying its drafts failed" in (o.error or "") for o in failed)
    assert spec.engine.scheduler.stats().spec_decode.num_drafts == before


def _drain(llm: LLM) -> RequestOutput:
    final = None
    while llm.engine.has_unfinished():
        for output in llm.engine.step():
            final = output
    assert final is not None and final.finished
    return final


def test_a_speculating_decode_engine_continues_an_imported_prefill_identically(
    pairs: Callable[[str], tuple[LLM, LLM]],
) -> None:
    """P/D at engine level: prefill without drafts (pinned KV), copy the blocks into the
    speculating engine (an import), decode there: the tokens of a local run without drafts."""
    base, spec = pairs(MODELS[0])
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    prompt = base.tokenizer.encode(PROMPTS[1])
    reference = base.generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)
    base.engine.add_request("p", prompt, params, prefill_only=True)
    first = _drain(base)
    pinned = base.engine.get_pinned_blocks("p")
    assert pinned is not None
    spec.engine.scheduler.reset_prefix_cache()
    before = spec.engine.scheduler.stats().spec_decode
    allocation = spec.engine.add_import_request("d", prompt, params, first.outputs[0].token_ids[0])
    spec.engine.parts.storage.kv[allocation.block_ids] = base.engine.parts.storage.kv[
        pinned.block_ids
    ]
    assert base.engine.release("p")
    assert spec.engine.mark_kv_ready("d")
    final = _drain(spec)
    assert final.outputs[0].token_ids == reference[0].outputs[0].token_ids
    after = spec.engine.scheduler.stats().spec_decode
    assert after.num_drafts > before.num_drafts
    for llm in (base, spec):
        llm.engine.scheduler.check_integrity()
        assert llm.engine.scheduler.stats().num_used_blocks == 0
