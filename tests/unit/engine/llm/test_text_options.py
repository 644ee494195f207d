"""vLLM's text options: ``skip_special_tokens`` and ``include_stop_str_in_output``."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def tiny_llama() -> LLM:
    return LLM("builtin:tiny-llama", max_model_len=512, kv_cache_memory_bytes=8 << 20)


def test_special_tokens_are_skipped_unless_asked_for(tiny_llama: LLM) -> None:
    llm = tiny_llama
    eos = llm.tokenizer.eos_token_id
    assert eos is not None
    # the bias makes EOS the greedy choice; ignore_eos keeps generating it
    forced = {"max_tokens": 3, "temperature": 0.0, "ignore_eos": True, "logit_bias": {eos: 100.0}}
    kept = llm.generate("Hi", SamplingParams(**forced, skip_special_tokens=False))[0]
    skipped = llm.generate("Hi", SamplingParams(**forced))[0]
    assert list(kept.token_ids) == list(skipped.token_ids) == [eos] * 3
    special = llm.tokenizer.decode([eos], skip_special_tokens=False)
    assert special and kept.text == special * 3
    assert skipped.text == ""


def test_a_matched_stop_string_is_kept_when_asked(tiny_llama: LLM) -> None:
    llm = tiny_llama
    base = llm.generate("Once upon", SamplingParams(max_tokens=24, temperature=0))[0].text
    stop = base[5:8]
    assert len(stop) == 3, "the reference output is too short to cut"
    cut = SamplingParams(max_tokens=24, temperature=0, stop=[stop])
    dropped = llm.generate("Once upon", cut)[0]
    kept = llm.generate(
        "Once upon", SamplingParams(max_tokens=24, temperature=0, stop=[stop],
                                    include_stop_str_in_output=True)
    )[0]  # fmt: skip
    assert dropped.text == base[: base.index(stop)]
    assert kept.text == base[: base.index(stop) + 3]
    assert kept.finish_reason == dropped.finish_reason == "stop"
    assert kept.outputs[0].stop_reason == stop
