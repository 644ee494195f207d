"""SamplingParams validation: every bad field raises a typed error naming it."""

from __future__ import annotations

import pytest

from core.errors import InvalidRequestError, SamplingParamsError
from core.sampling import MAX_SEED, MIN_SEED, SamplingParams, generator_seed, sequence_seed


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
        ({"seed": 2**63}, "seed"),  # past a signed 64-bit integer (vLLM's range)
        ({"seed": -(2**63) - 1}, "seed"),
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


@pytest.mark.parametrize("seed", [-1, MIN_SEED, 0, MAX_SEED])
def test_any_signed_64_bit_seed_is_accepted(seed: int) -> None:
    assert SamplingParams(seed=seed).seed == seed


def test_signed_seeds_map_one_to_one_onto_the_generators() -> None:
    assert (MIN_SEED, MAX_SEED) == (-(2**63), 2**63 - 1)
    assert [generator_seed(s) for s in (0, 1, MAX_SEED, MIN_SEED, -1)] == [
        0, 1, 2**63 - 1, 2**63, 2**64 - 1,
    ]  # fmt: skip


def test_sequence_seeds_wrap_inside_the_signed_range() -> None:
    assert sequence_seed(None, 3) is None
    assert [sequence_seed(-2, i) for i in range(3)] == [-2, -1, 0]
    assert sequence_seed(MAX_SEED, 1) == MIN_SEED
    assert SamplingParams(seed=sequence_seed(MAX_SEED, 5)).seed == MIN_SEED + 4


def test_defaults_and_normalisation() -> None:
    params = SamplingParams(stop="END", stop_token_ids=[7, 8], temperature=0.0)
    assert params.stop == ("END",)
    assert params.stop_token_ids == (7, 8)
    assert params.greedy
    assert not SamplingParams().greedy
    assert hash(params) == hash(SamplingParams(stop=["END"], stop_token_ids=(7, 8), temperature=0))
