"""Built-in models against HF, the disaggregation hooks end to end inside one process, and the
offline API's behaviour on stops, seeds, aborts and bad input."""

from __future__ import annotations

import pytest
import torch

from core.errors import ModelNotFoundError, PromptTooLongError, SamplingParamsError
from core.sampling import StructuredOutput
from engine import LLM, SamplingParams
from engine.builtin import resolve_model


@pytest.fixture(scope="module")
def tiny_llama() -> LLM:
    return LLM("builtin:tiny-llama", max_model_len=512, kv_cache_memory_bytes=8 << 20)


@pytest.mark.parametrize("name", ["builtin:tiny-llama", "builtin:tiny-moe"])
def test_builtin_greedy_matches_hf(name: str) -> None:
    from transformers import AutoModelForCausalLM

    llm = LLM(name, max_model_len=512)
    hf = AutoModelForCausalLM.from_pretrained(resolve_model(name), dtype=torch.float32).eval()
    texts = ["Hello, world!", "The capital of France is", "x"]
    outs = llm.generate(texts, sampling_params=SamplingParams(max_tokens=32, temperature=0))
    for text, out in zip(texts, outs, strict=True):
        ids = torch.tensor([llm.tokenizer.encode(text)])
        with torch.inference_mode():
            ref = hf.generate(ids, max_new_tokens=32, do_sample=False)[0, ids.shape[1] :]
        assert list(out.token_ids) == ref.tolist()
        assert len(set(out.token_ids)) > 3, "degenerate output: random weights too flat"


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=20, temperature=0.8, seed=11),
        SamplingParams(
            max_tokens=20, temperature=0.8, seed=11, presence_penalty=0.5,
            frequency_penalty=0.7, repetition_penalty=1.3, logit_bias={5: 2.0},
        ),  # the decode side recomputes penalties from the ids it imports
        SamplingParams(
            max_tokens=40, temperature=0.8, seed=11,
            structured_output=StructuredOutput("json", '{"type": "object", "properties": '
                                               '{"a": {"type": "integer"}}, "required": ["a"]}'),
        ),  # ... and its grammar state, by accepting the first token
    ],
    ids=["plain", "penalties", "grammar"],
)  # fmt: skip
def test_prefill_only_then_import_equals_a_local_run(
    tiny_llama: LLM, params: SamplingParams
) -> None:
    """Prefill in engine A (pinned KV), copy the blocks into engine B (import), decode there."""
    prompt = tiny_llama.tokenizer.encode("A prompt that spans a few blocks of sixteen tokens.")
    reference = tiny_llama.generate(prompt_token_ids=[prompt], sampling_params=params)[0]

    prefill = LLM("builtin:tiny-llama", max_model_len=512, kv_cache_memory_bytes=8 << 20)
    engine_a = prefill.engine
    engine_a.add_request("p", prompt, params, prefill_only=True)
    first = None
    while engine_a.has_unfinished():
        for out in engine_a.step():
            first = out
    assert first is not None and first.finished and len(first.token_ids) == 1
    pinned = engine_a.get_pinned_blocks("p")
    assert pinned is not None and pinned.num_tokens == len(prompt)

    engine_b = tiny_llama.engine
    tiny_llama.engine.scheduler.reset_prefix_cache()
    alloc = engine_b.add_import_request("d", prompt, params, first.token_ids[0])
    assert alloc.num_local_blocks == 0
    src = engine_a.parts.storage.kv[pinned.block_ids]
    engine_b.parts.storage.kv[alloc.block_ids] = src
    assert engine_a.release("p") and not engine_a.release("p")
    assert engine_b.mark_kv_ready("d")
    final = None
    while engine_b.has_unfinished():
        for out in engine_b.step():
            final = out
    assert final is not None and final.finished
    assert final.token_ids == reference.token_ids
    assert final.text and reference.text.endswith(final.text)
    engine_a.scheduler.check_integrity()
    assert engine_a.scheduler.stats().num_used_blocks == 0


def test_stop_strings_seeds_and_abort(tiny_llama: LLM) -> None:
    base = tiny_llama.generate(
        "Once upon", sampling_params=SamplingParams(max_tokens=24, temperature=0)
    )[0]
    stop = base.text[5:8]
    assert stop, "the reference output is too short to cut"
    cut = tiny_llama.generate(
        "Once upon", sampling_params=SamplingParams(max_tokens=24, temperature=0, stop=[stop])
    )[0]
    assert cut.finish_reason == "stop"
    assert cut.text == base.text[: base.text.index(stop)]

    seeded = SamplingParams(max_tokens=16, temperature=1.0, seed=5)
    a = tiny_llama.generate(["alpha", "beta"], sampling_params=seeded)
    b = tiny_llama.generate(["gamma", "beta"], sampling_params=seeded)
    assert a[1].token_ids == b[1].token_ids  # a seed gives the same tokens whatever the batch

    engine = tiny_llama.engine
    engine.add_request("gone", tiny_llama.tokenizer.encode("to be aborted"), seeded)
    engine.step()
    assert engine.abort("gone") and not engine.abort("gone")
    assert not engine.has_unfinished()
    engine.scheduler.check_integrity()
    assert engine.scheduler.stats().num_used_blocks == 0


def test_bad_input_raises_typed_errors(tiny_llama: LLM) -> None:
    with pytest.raises(PromptTooLongError) as info:
        tiny_llama.generate(prompt_token_ids=[[5] * 600])
    assert "512" in info.value.message
    with pytest.raises(SamplingParamsError):
        tiny_llama.generate("x", sampling_params=SamplingParams(temperature=-1))
    with pytest.raises(ModelNotFoundError) as missing:
        LLM("/nonexistent/model-dir")
    assert "/nonexistent/model-dir" in missing.value.message
    with pytest.raises(ModelNotFoundError) as unknown:
        LLM("builtin:giant")
    assert "builtin:tiny-llama" in unknown.value.message
    assert not tiny_llama.engine.has_unfinished()
