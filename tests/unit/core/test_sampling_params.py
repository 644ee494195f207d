"""SamplingParams validation: every bad field raises a typed error naming it."""

from __future__ import annotations

import pytest

from core.errors import InvalidRequestError, SamplingParamsError
from core.sampling import SamplingParams


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
        ({"logprobs": 21}, "logprobs"),
    ],
)
def test_invalid_fields_name_the_field(kwargs: dict[str, object], param: str) -> None:
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert info.value.param == param
    assert param in info.value.message
    assert isinstance(info.value, InvalidRequestError)
    assert info.value.to_openai()["error"]["param"] == param


def test_defaults_and_normalisation() -> None:
    params = SamplingParams(stop="END", stop_token_ids=[7, 8], temperature=0.0)
    assert params.stop == ("END",)
    assert params.stop_token_ids == (7, 8)
    assert params.greedy
    assert not SamplingParams().greedy
    assert hash(params) == hash(SamplingParams(stop=["END"], stop_token_ids=(7, 8), temperature=0))
