"""Migration keeps a request speculating: a request continued on a speculating engine with part
of its output already generated (the ingress's migration: a local prefill of prompt + output
so far; or a P/D import of that prefix) drafts from every token so far and its greedy
continuation equals the run that never moved."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from core.sampling import SamplingParams
from engine.llm import LLM
from engine.outputs import RequestOutput

NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 1,
    "pause_unprofitable_drafts": False,  # every step drafts what its n-grams give
}
PROMPT = "a b c d e f a b c d e f a b c d e f a b"
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[LLM, LLM]]:
    """The tiny model without and with n-gram drafts."""
    kw: dict[str, Any] = {"max_model_len": 512, "kv_cache_memory_bytes": 8 << 20}
    with (
        LLM("builtin:tiny-llama", **kw) as base,
        LLM("builtin:tiny-llama", speculative_config=NGRAM, **kw) as spec,
    ):
        yield base, spec


def _reference(base: LLM, prompt: list[int]) -> tuple[int, ...]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = base.generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)
    return outputs[0].outputs[0].token_ids


def _drain(llm: LLM) -> RequestOutput:
    final = None
    while llm.engine.has_unfinished():
        for output in llm.engine.step():
            final = output
    assert final is not None and final.finished
    return final


def _num_drafts(llm: LLM) -> int:
    return llm.engine.scheduler.stats().spec_decode.num_drafts


@pytest.mark.parametrize("num_sent", [1, 9, 23])
def test_a_migrated_request_speculates_and_continues_identically(
    engines: tuple[LLM, LLM], num_sent: int
) -> None:
    base, spec = engines
    prompt = base.tokenizer.encode(PROMPT)
    reference = _reference(base, prompt)
    owed = MAX_TOKENS - num_sent
    params = SamplingParams(temperature=0.0, max_tokens=owed, ignore_eos=True)
    before = _num_drafts(spec)
    spec.engine.add_request(f"m{num_sent}", [*prompt, *reference[:num_sent]], params)
    final = _drain(spec)
    assert final.outputs[0].token_ids == reference[num_sent:]
    assert _num_drafts(spec) > before
    spec.engine.scheduler.check_integrity()
    assert spec.engine.scheduler.stats().num_used_blocks == 0


def test_a_request_imported_mid_output_speculates_and_continues_identically(
    engines: tuple[LLM, LLM],
) -> None:
    """The prefix (prompt + 12 tokens) prefilled elsewhere, its KV copied in with the 13th
    token as the import's first token: the speculating engine decodes the rest."""
    base, spec = engines
    prompt = base.tokenizer.encode(PROMPT)
    reference = _reference(base, prompt)
    num_sent = 12
    prefix = [*prompt, *reference[:num_sent]]
    owed = MAX_TOKENS - num_sent
    params = SamplingParams(temperature=0.0, max_tokens=owed, ignore_eos=True)
    base.engine.add_request("p", prefix, params, prefill_only=True)
    first = _drain(base).outputs[0].token_ids[0]
    assert first == reference[num_sent]
    pinned = base.engine.get_pinned_blocks("p")
    assert pinned is not None
    spec.engine.scheduler.reset_prefix_cache()
    before = _num_drafts(spec)
    allocation = spec.engine.add_import_request("d", prefix, params, first)
    storage = spec.engine.parts.storage
    storage.kv[allocation.block_ids] = base.engine.parts.storage.kv[pinned.block_ids]
    assert base.engine.release("p")
    assert spec.engine.mark_kv_ready("d")
    final = _drain(spec)
    assert final.outputs[0].token_ids == reference[num_sent:]
    assert _num_drafts(spec) > before
    for llm in (base, spec):
        llm.engine.scheduler.check_integrity()
        assert llm.engine.scheduler.stats().num_used_blocks == 0
