"""logit_bias and the presence / frequency / repetition penalties: the formulas row by row, the
engine's greedy output against HF ``generate(repetition_penalty=...)``, and typed errors."""

from __future__ import annotations

import pytest
import torch

from core.errors import SamplingParamsError
from core.sampling import SamplingParams
from engine.sampling import penalties
from engine.sampling.row import SamplingRow
from engine.sampling.sampler import Sampler


def test_bias_and_penalties_follow_the_openai_and_ctrl_formulas() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, 1.0]])
    params = SamplingParams(
        presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=2.0,
        logit_bias={4: 10.0},
    )  # fmt: skip
    row = SamplingRow(params, prompt_token_ids=(1,), output_token_ids=(0, 0, 3))
    out = penalties.apply(logits, [row])
    # token 0: seen twice in the output: 2 / 2 - 2 * 0.25 - 0.5; token 1: prompt only: -1 * 2;
    # token 3: once: 3 / 2 - 0.25 - 0.5; token 4: biased, never seen
    assert out.tolist() == [[0.0, -2.0, 0.5, 0.75, 11.0]]
    assert logits.tolist() == [[2.0, -1.0, 0.5, 3.0, 1.0]]  # the input is left alone


def test_rows_without_bias_or_penalty_are_untouched_and_rows_stay_independent() -> None:
    logits = torch.randn(3, 7)
    plain = SamplingRow(SamplingParams())
    assert penalties.apply(logits, [plain] * 3) is logits
    biased = SamplingRow(SamplingParams(temperature=0.0, logit_bias={6: 100.0}))
    out = Sampler(seed=0).sample(logits, [plain, biased, plain])
    assert out.token_ids[1] == 6
    assert out.logprobs == [None, None, None]


def test_a_negative_bias_bans_and_a_positive_one_forces_through_the_engine() -> None:
    from engine import LLM

    llm = LLM("builtin:tiny-llama", max_model_len=256)
    prompt = [[5, 9, 13, 21]]
    base = llm.generate(prompt_token_ids=prompt, sampling_params=SamplingParams(
        temperature=0.0, max_tokens=8), use_tqdm=False)[0].outputs[0].token_ids  # fmt: skip
    banned = dict.fromkeys(set(base), -100.0)
    steered = (
        llm.generate(
            prompt_token_ids=prompt,
            sampling_params=SamplingParams(temperature=0.0, max_tokens=8, logit_bias=banned),
            use_tqdm=False,
        )[0]
        .outputs[0]
        .token_ids
    )
    assert not set(steered) & set(base)
    forced = (
        llm.generate(
            prompt_token_ids=prompt,
            sampling_params=SamplingParams(temperature=0.0, max_tokens=4, logit_bias={42: 100.0}),
            use_tqdm=False,
        )[0]
        .outputs[0]
        .token_ids
    )
    assert list(forced) == [42] * 4
    with pytest.raises(SamplingParamsError) as err:
        llm.generate(prompt_token_ids=prompt, sampling_params=SamplingParams(
            logit_bias={10**6: 1.0}), use_tqdm=False)  # fmt: skip
    assert err.value.param == "logit_bias"


@pytest.mark.parametrize(
    ("field", "value"),
    [("presence_penalty", 2.5), ("frequency_penalty", -3), ("repetition_penalty", 0.0),
     ("repetition_penalty", float("nan")), ("logit_bias", {"a": 1}), ("logit_bias", {1: 101})],
)  # fmt: skip
def test_bad_values_name_their_field(field: str, value: object) -> None:
    with pytest.raises(SamplingParamsError) as err:
        SamplingParams(**{field: value})  # type: ignore[arg-type]
    assert err.value.param == field
