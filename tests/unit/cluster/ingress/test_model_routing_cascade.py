"""The cascade's checks on a cheap answer, and the logprobs it asks for and hides."""

from __future__ import annotations

import math
from typing import Any

import pytest

from cluster.ingress.model_routing import (
    AnswerSummary,
    escalation_reason,
    needs_logprobs,
    strip_logprobs,
    summarize_answer,
    with_logprobs,
)
from core.config import CascadeConfig


def cascade(**fields: Any) -> CascadeConfig:
    return CascadeConfig.model_validate({"escalate_to": "big", **fields})


def answer(
    *finish_reasons: str | None, text: str = "", logprobs: tuple[float, ...] = ()
) -> AnswerSummary:
    return AnswerSummary(tuple(finish_reasons) or ("stop",), text, logprobs)


CHAT_BODY: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "Hi"},
            "logprobs": {
                "content": [
                    {"token": "H", "logprob": -0.5, "bytes": [72], "top_logprobs": []},
                    {"token": "i", "logprob": -1.5, "bytes": [105], "top_logprobs": []},
                ]
            },
        },
        {
            "index": 1,
            "finish_reason": "length",
            "message": {"role": "assistant", "content": "Yo"},
            "logprobs": {"content": [{"token": "Yo", "logprob": -1.0}]},
        },
    ],
}

COMPLETION_BODY: dict[str, Any] = {
    "id": "cmpl-1",
    "object": "text_completion",
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",
            "text": "four",
            "logprobs": {"tokens": ["f", "our"], "token_logprobs": [None, -0.25, -0.75]},
        },
        {"index": 1, "finish_reason": None, "text": "five", "logprobs": None},
    ],
}


def test_summarize_chat_answer() -> None:
    assert summarize_answer(CHAT_BODY, chat=True) == AnswerSummary(
        ("stop", "length"), "Hi\nYo", (-0.5, -1.5, -1.0)
    )


def test_summarize_completion_answer_skips_null_logprobs() -> None:
    assert summarize_answer(COMPLETION_BODY, chat=False) == AnswerSummary(
        ("stop", None), "four\nfive", (-0.25, -0.75)
    )


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"choices": "x"},
        {"choices": [None, {"finish_reason": 3, "message": "m", "text": 5, "logprobs": []}]},
        {"choices": [{"logprobs": {"content": [None, {"logprob": "x"}], "token_logprobs": 1}}]},
    ],
)
@pytest.mark.parametrize("chat", [True, False])
def test_summarize_never_raises_on_malformed_bodies(body: dict[str, Any], chat: bool) -> None:
    summary = summarize_answer(body, chat=chat)
    assert summary.token_logprobs == ()
    assert all(reason is None for reason in summary.finish_reasons)


def test_length_escalates_unless_turned_off() -> None:
    assert escalation_reason(cascade(), answer("stop", "length")) == "length"
    assert escalation_reason(cascade(on_length=False), answer("stop", "length")) is None
    assert escalation_reason(cascade(), answer("stop", None)) is None


def test_refusal_regex_searches_the_text() -> None:
    check = cascade(refusal_regex=r"(?i)i can(no|')t help")
    assert escalation_reason(check, answer(text="Sorry, I can't help with that")) == "refusal"
    assert escalation_reason(check, answer(text="Sure, here it is")) is None
    assert escalation_reason(cascade(), answer(text="I can't help")) is None


def test_low_mean_logprob_escalates_strictly_below_the_floor() -> None:
    check = cascade(min_mean_logprob=-1.0)
    assert escalation_reason(check, answer(logprobs=(-0.5, -1.6))) == "low_logprob"
    assert escalation_reason(check, answer(logprobs=(-0.5, -1.5))) is None
    assert escalation_reason(check, answer(logprobs=(-1.0,))) is None
    assert escalation_reason(check, answer(logprobs=(-math.inf, 0.0))) == "low_logprob"


def test_no_logprobs_pass_the_logprob_check() -> None:
    assert escalation_reason(cascade(min_mean_logprob=0.0), answer(logprobs=())) is None
    assert escalation_reason(cascade(), answer(logprobs=(-9.0,))) is None


def test_checks_run_in_order_length_refusal_logprob() -> None:
    check = cascade(refusal_regex="no", min_mean_logprob=-1.0)
    assert escalation_reason(check, answer("length", text="no", logprobs=(-5.0,))) == "length"
    assert escalation_reason(check, answer("stop", text="no", logprobs=(-5.0,))) == "refusal"
    assert escalation_reason(check, answer("stop", text="ok", logprobs=(-5.0,))) == "low_logprob"


def test_needs_logprobs_only_for_the_logprob_check() -> None:
    assert needs_logprobs(cascade(min_mean_logprob=-2.0))
    assert not needs_logprobs(cascade(refusal_regex="x"))


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"prompt": "p"}, {"prompt": "p", "logprobs": 0}),
        ({"prompt": "p", "logprobs": None}, {"prompt": "p", "logprobs": 0}),
        ({"prompt": "p", "logprobs": 3}, {"prompt": "p", "logprobs": 3}),
        ({"prompt": "p", "logprobs": 0}, {"prompt": "p", "logprobs": 0}),
    ],
)
def test_with_logprobs_for_completions(data: dict[str, Any], expected: dict[str, Any]) -> None:
    before = dict(data)
    assert with_logprobs(data, chat=False) == expected
    assert data == before


@pytest.mark.parametrize(
    ("asked", "sent"),
    [
        ({}, {"logprobs": True, "top_logprobs": 0}),
        ({"logprobs": False}, {"logprobs": True, "top_logprobs": 0}),
        ({"logprobs": None, "top_logprobs": None}, {"logprobs": True, "top_logprobs": 0}),
        ({"logprobs": True}, {"logprobs": True}),
        ({"logprobs": True, "top_logprobs": 4}, {"logprobs": True, "top_logprobs": 4}),
        ({"logprobs": False, "top_logprobs": 4}, {"logprobs": False, "top_logprobs": 4}),
    ],
)
def test_with_logprobs_for_chat(asked: dict[str, Any], sent: dict[str, Any]) -> None:
    data = {"messages": [], **asked}
    assert with_logprobs(data, chat=True) == {"messages": [], **sent}
    assert data == {"messages": [], **asked}


@pytest.mark.parametrize("body", [CHAT_BODY, COMPLETION_BODY])
def test_strip_logprobs_nulls_every_choice_and_copies(body: dict[str, Any]) -> None:
    stripped = strip_logprobs(body)
    assert [choice["logprobs"] for choice in stripped["choices"]] == [None, None]
    assert stripped["id"] == body["id"]
    assert body["choices"][0]["logprobs"] is not None
    without = [{k: v for k, v in c.items() if k != "logprobs"} for c in stripped["choices"]]
    assert without == [{k: v for k, v in c.items() if k != "logprobs"} for c in body["choices"]]
