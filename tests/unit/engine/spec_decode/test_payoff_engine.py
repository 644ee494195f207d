"""Never slower, in the engine: its steps feed the cost fit, and with a fit that says drafts do
not pay, requests stop drafting after their first verification (output unchanged)."""

from __future__ import annotations

from typing import Any

import pytest

from core.sampling import SamplingParams
from engine.llm import LLM
from engine.spec_decode import StepCostFit

NGRAM: dict[str, Any] = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}
PROMPTS = ["a b c d e f a b c d e f a b c d e f a b", "one two three one two three one two"]
# every draft token costs as much as ten whole steps: none can pay
COSTLY = StepCostFit(base_s=0.01, per_row_s=0.001, per_verify_row_s=0.0, per_draft_s=0.1)


def _llm(**kw: Any) -> LLM:
    return LLM("builtin:tiny-llama", max_model_len=512, kv_cache_memory_bytes=8 << 20, **kw)


def _token_ids(llm: LLM, params: SamplingParams) -> list[tuple[int, ...]]:
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    llm.engine.scheduler.check_integrity()
    return [o.outputs[0].token_ids for o in outputs]


def test_unprofitable_drafts_pause_and_greedy_output_stays_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    with _llm() as base:
        expected = _token_ids(base, params)
    with _llm(speculative_config=NGRAM) as spec:
        speculation = spec.engine.speculation
        assert speculation is not None and speculation.payoff is not None
        monkeypatch.setattr(speculation.payoff.costs, "estimate", lambda: COSTLY)
        assert _token_ids(spec, params) == expected
        stats = spec.engine.scheduler.stats().spec_decode
    with _llm(speculative_config={**NGRAM, "pause_unprofitable_drafts": False}) as spec:
        assert _token_ids(spec, params) == expected
        unpaused = spec.engine.scheduler.stats().spec_decode
    # each request drafted once (no rate yet), then only on its probes after pauses of
    # 4, 8, 16 steps: fewer verify rows than drafting whenever the n-grams match
    assert 0 < stats.num_drafts <= len(PROMPTS) * 4 < unpaused.num_drafts


def test_decode_steps_feed_the_fit_and_the_rule_can_be_switched_off() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with _llm(speculative_config=NGRAM) as spec:
        speculation = spec.engine.speculation
        assert speculation is not None and speculation.payoff is not None
        _token_ids(spec, params)
        # every step after the prompts' is decode-only: at least the last token's steps
        assert speculation.payoff.costs.num_steps >= 24 // (NGRAM["num_speculative_tokens"] + 1)
    with _llm(speculative_config={**NGRAM, "pause_unprofitable_drafts": False}) as spec:
        assert spec.engine.speculation is not None
        assert spec.engine.speculation.payoff is None
