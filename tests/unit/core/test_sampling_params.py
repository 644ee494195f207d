"""SamplingParams validation: every bad field raises a typed error naming it."""

from __future__ import annotations

import pytest

from core.errors import InvalidRequestError, SamplingParamsError
from core.sampling import MAX_SEED, SamplingParams


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 9, "max_tokens": 8}, "min_tokens"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-3]}, "stop_token_ids"),
        ({"n": 0}, "n"),
        ({"n": 1.0}, "n"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": 1.5}, "logprobs"),
        ({"seed": 2**64}, "seed"),  # past what torch.Generator.manual_seed takes
        ({"seed": -1}, "seed"),  # the generator would alias it to 2**64 - 1
        ({"seed": True}, "seed"),
        ({"seed": "7"}, "seed"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": 10**400}, "temperature"),
        ({"temperature": 1e39}, "temperature"),  # inf as the sampler's float32
        ({"top_k": 2**63}, "top_k"),  # past torch's int64
        ({"max_tokens": 2**63}, "max_tokens"),
        ({"top_p": float("nan")}, "top_p"),
        ({"max_tokens": True}, "max_tokens"),
        ({"min_tokens": 1.0}, "min_tokens"),
        ({"stop": 5}, "stop"),
        ({"stop_token_ids": [True]}, "stop_token_ids"),
        ({"stop_token_ids": 7}, "stop_token_ids"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
    ],
)
def test_invalid_fields_name_the_field(kwargs: dict[str, object], param: str) -> None:
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert info.value.param == param
    assert param in info.value.message
    assert isinstance(info.value, InvalidRequestError)
    assert info.value.to_openai()["error"]["param"] == param


def test_seed_range_is_the_generators() -> None:
    assert SamplingParams(seed=0).seed == 0
    assert SamplingParams(seed=MAX_SEED).seed == 2**64 - 1


def test_defaults_and_normalisation() -> None:
    params = SamplingParams(stop="END", stop_token_ids=[7, 8], temperature=0.0)
    assert params.stop == ("END",)
    assert params.stop_token_ids == (7, 8)
    assert params.greedy
    assert not SamplingParams().greedy
    assert hash(params) == hash(SamplingParams(stop=["END"], stop_token_ids=(7, 8), temperature=0))
