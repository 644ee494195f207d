"""The offline API reads like vLLM's: positional ``sampling_params``, ``outputs[i]`` completions
with logprobs and stop reasons, ``n`` sequences per prompt, ``chat`` and a progress bar."""

from __future__ import annotations

import pytest

from core.errors import SamplingParamsError
from engine import LLM, CompletionOutput, SamplingParams

GREEDY_4 = SamplingParams(max_tokens=4, temperature=0)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("builtin:tiny-llama", max_model_len=512, kv_cache_memory_bytes=8 << 20)


def assert_idle(llm: LLM) -> None:
    llm.engine.scheduler.check_integrity()
    assert not llm.engine.has_unfinished()
    assert llm.engine.scheduler.stats().num_used_blocks == 0


def test_a_vllm_script_runs_and_positional_equals_keyword(llm: LLM) -> None:
    outs = llm.generate(["a", "b"], GREEDY_4, use_tqdm=False)
    by_keyword = llm.generate(prompts=["a", "b"], sampling_params=GREEDY_4, use_tqdm=False)
    as_dicts = llm.generate(
        [{"prompt": "a"}, {"prompt_token_ids": llm.tokenizer.encode("b")}], GREEDY_4
    )
    assert len(outs) == 2
    for out, text in zip(outs, ["a", "b"], strict=True):
        assert out.finished and out.prompt == text
        assert out.prompt_token_ids == tuple(llm.tokenizer.encode(text))
        assert isinstance(out.num_cached_tokens, int)
        (seq,) = out.outputs
        assert isinstance(seq, CompletionOutput) and seq.index == 0
        assert seq.finished() and seq.finish_reason == "length" and seq.stop_reason is None
        assert len(seq.token_ids) == 4 and isinstance(seq.text, str)
        assert seq.cumulative_logprob is None and seq.logprobs is None  # not asked for
        assert (out.text, out.token_ids, out.finish_reason) == (
            seq.text,
            seq.token_ids,
            seq.finish_reason,
        )
    assert [o.outputs for o in by_keyword] == [o.outputs for o in outs]
    assert [o.outputs for o in as_dicts] == [o.outputs for o in outs]
    assert as_dicts[1].prompt is None
    assert_idle(llm)


def test_logprobs_are_vllm_shaped(llm: LLM) -> None:
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True, logprobs=3)
    (seq,) = llm.generate("Hello", params, use_tqdm=False)[0].outputs
    assert seq.logprobs is not None and len(seq.logprobs) == len(seq.token_ids) == 5
    for token_id, position in zip(seq.token_ids, seq.logprobs, strict=True):
        assert len(position) == 3  # greedy: the sampled token is the top one
        assert position[token_id].rank == 1
        ranked = sorted(position.items(), key=lambda item: item[1].rank or 0)
        assert [entry.rank for _, entry in ranked] == [1, 2, 3]
        values = [entry.logprob for _, entry in ranked]
        assert values == sorted(values, reverse=True) and values[0] <= 0.0
        for tid, entry in position.items():
            assert entry.decoded_token == llm.tokenizer.decode([tid], skip_special_tokens=False)
    sampled = [position[t].logprob for t, position in zip(seq.token_ids, seq.logprobs, strict=True)]
    assert seq.cumulative_logprob == pytest.approx(sum(sampled))

    only = SamplingParams(max_tokens=3, temperature=1.0, seed=3, ignore_eos=True, logprobs=0)
    (seq,) = llm.generate("Hello", only, use_tqdm=False)[0].outputs
    assert seq.logprobs is not None
    assert [list(p) for p in seq.logprobs] == [[t] for t in seq.token_ids]  # the sampled one
    assert all((p[t].rank or 0) >= 1 for t, p in zip(seq.token_ids, seq.logprobs, strict=True))


def test_stop_reason_names_the_stop_string_or_token(llm: LLM) -> None:
    long = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    base = llm.generate("Once upon", long, use_tqdm=False)[0].outputs[0]
    assert base.stop_reason is None and base.finish_reason == "length"
    stop = base.text[5:8]
    by_string = llm.generate(
        "Once upon", SamplingParams(max_tokens=24, temperature=0, stop=[stop, "\x00never"])
    )[0].outputs[0]
    assert (by_string.finish_reason, by_string.stop_reason) == ("stop", stop)
    assert by_string.text == base.text[: base.text.index(stop)]
    token = base.token_ids[3]
    by_token = llm.generate(
        "Once upon", SamplingParams(max_tokens=24, temperature=0, stop_token_ids=[token])
    )[0].outputs[0]
    assert (by_token.finish_reason, by_token.stop_reason) == ("stop", token)
    assert by_token.token_ids == base.token_ids[: base.token_ids.index(token) + 1]


def test_n_sequences_per_prompt_with_derived_seeds(llm: LLM) -> None:
    params = SamplingParams(n=3, max_tokens=8, temperature=1.0, seed=5, ignore_eos=True)
    outs = llm.generate(["alpha", "beta"], params, use_tqdm=False)
    assert [o.prompt for o in outs] == ["alpha", "beta"]
    for out in outs:
        assert [seq.index for seq in out.outputs] == [0, 1, 2]
        assert len({seq.token_ids for seq in out.outputs}) > 1  # distinct seeds, distinct samples
        for i, seq in enumerate(out.outputs):  # sequence i samples with seed + i
            single = SamplingParams(max_tokens=8, temperature=1.0, seed=5 + i, ignore_eos=True)
            alone = llm.generate(out.prompt, single, use_tqdm=False)[0].outputs[0]
            assert seq.token_ids == alone.token_ids and seq.text == alone.text
    unseeded = llm.generate("alpha", SamplingParams(n=2, max_tokens=3), use_tqdm=False)
    assert [seq.index for seq in unseeded[0].outputs] == [0, 1]
    assert_idle(llm)


def test_an_engine_request_refuses_n_above_one(llm: LLM) -> None:
    with pytest.raises(SamplingParamsError) as info:
        llm.engine.add_request("n2", [1, 2, 3], SamplingParams(n=2))
    assert info.value.param == "n"
    assert_idle(llm)


def test_chat_takes_sampling_params_positionally(llm: LLM) -> None:
    conversation = [{"role": "user", "content": "hi"}]
    (out,) = llm.chat(conversation, GREEDY_4, use_tqdm=False)
    rendered = llm.tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
    ids = llm.tokenizer.encode(rendered, add_special_tokens=False)
    assert out.prompt_token_ids == tuple(ids)
    direct = llm.generate(prompt_token_ids=[ids], sampling_params=GREEDY_4, use_tqdm=False)
    assert out.outputs == direct[0].outputs
    other = [{"role": "user", "content": "bye"}]
    both = llm.chat([conversation, other], GREEDY_4, use_tqdm=False)
    assert len(both) == 2 and both[0].outputs == out.outputs


def test_progress_bar_on_stderr_only_when_asked(
    llm: LLM, capsys: pytest.CaptureFixture[str]
) -> None:
    llm.generate(["a", "b"], GREEDY_4)
    shown = capsys.readouterr()
    assert "Processed prompts" in shown.err and "2/2" in shown.err and shown.out == ""
    llm.generate(["a", "b"], GREEDY_4, use_tqdm=False)
    hidden = capsys.readouterr()
    assert hidden.err == "" and hidden.out == ""
