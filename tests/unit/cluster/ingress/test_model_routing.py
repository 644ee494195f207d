"""Virtual-model routing: what ``route_inputs`` reads off a request and which model each rule
kind picks."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from cluster.ingress.model_routing import (
    RouteDecision,
    RouteInputs,
    choose_model,
    route_inputs,
)
from core.config import VirtualModelConfig


def words(text: str) -> int:
    """A stand-in tokenizer: one token per whitespace-separated word."""
    return len(text.split())


def inputs(**overrides: Any) -> RouteInputs:
    base = RouteInputs(
        prompt_tokens=10, output_tokens=100, headers={}, user=None, metadata={}, message_text=""
    )
    return replace(base, **overrides)


def virtual(*rules: dict[str, Any], cascade: dict[str, Any] | None = None) -> VirtualModelConfig:
    return VirtualModelConfig.model_validate(
        {"name": "auto", "default": "small", "rules": list(rules), "cascade": cascade}
    )


def picks(rule: dict[str, Any], routed: RouteInputs) -> bool:
    """Whether a virtual model with only ``rule`` (model ``big``) sends ``routed`` to it."""
    return choose_model(virtual({"model": "big", **rule}), routed).model == "big"


# --- route_inputs --------------------------------------------------------------------------


def test_chat_inputs() -> None:
    data = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "an answer"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look at"},
                    {"type": "image_url", "image_url": {"url": "x"}},
                    {"type": "text", "text": "this picture"},
                ],
            },
        ],
        "max_completion_tokens": 64,
        "max_tokens": 8,
        "user": "alice",
        "metadata": {"tier": "gold", "n": 3, "flag": True},
    }
    got = route_inputs(data, {"X-Tenant": "acme"}, chat=True, count_tokens=words)
    assert got == RouteInputs(
        prompt_tokens=2 + 2 + 2 + 4,
        output_tokens=64,
        headers={"x-tenant": "acme"},
        user="alice",
        metadata={"tier": "gold"},
        message_text="look at\nthis picture",
    )


def test_chat_output_tokens_falls_back_to_max_tokens_and_is_none_unset() -> None:
    def output_tokens(data: dict[str, Any]) -> int | None:
        return route_inputs(data, {}, chat=True, count_tokens=words).output_tokens

    assert output_tokens({"messages": [], "max_tokens": 8}) == 8
    assert output_tokens({"messages": []}) is None
    assert output_tokens({"messages": [], "max_tokens": True}) is None


def test_chat_without_a_user_message_has_no_message_text() -> None:
    data = {"messages": [{"role": "system", "content": "hello there"}]}
    got = route_inputs(data, {}, chat=True, count_tokens=words)
    assert (got.message_text, got.prompt_tokens) == ("", 2)


@pytest.mark.parametrize(
    ("prompt", "prompt_tokens", "message_text"),
    [
        ("one two three", 3, "one two three"),
        (["a b", "c d e", "f"], 3, "a b\nc d e\nf"),
        ([5, 6, 7, 8], 4, ""),
        ([[1, 2], [3, 4, 5]], 3, ""),
        ([], 0, ""),
    ],
)
def test_completion_prompts(prompt: Any, prompt_tokens: int, message_text: str) -> None:
    got = route_inputs({"prompt": prompt, "max_tokens": 5}, {}, chat=False, count_tokens=words)
    assert (got.prompt_tokens, got.message_text, got.output_tokens) == (
        prompt_tokens,
        message_text,
        5,
    )


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"messages": "hi", "prompt": {"a": 1}},
        {"messages": [None, 3, {"role": "user", "content": 7}], "prompt": [None, 1.5, {}]},
        {"messages": [{"role": "user", "content": [None, {"type": "text", "text": 3}]}]},
        {"prompt": [[1, "x"], "a b", 4], "metadata": ["k"], "user": 5, "max_tokens": "9"},
        {"max_completion_tokens": None, "metadata": {1: "a", "b": None}},
    ],
)
@pytest.mark.parametrize("chat", [True, False])
def test_malformed_bodies_read_as_absent_fields(data: dict[str, Any], chat: bool) -> None:
    got = route_inputs(data, {}, chat=chat, count_tokens=words)
    assert got.output_tokens is None
    assert got.user is None
    assert got.metadata == {}
    assert got.prompt_tokens >= 0


def test_mixed_batch_counts_its_longest_prompt() -> None:
    got = route_inputs({"prompt": [[1, "x"], "a b", 4]}, {}, chat=False, count_tokens=words)
    assert (got.prompt_tokens, got.message_text) == (2, "a b")


# --- choose_model: each rule kind ----------------------------------------------------------


def test_prompt_token_bounds_are_inclusive() -> None:
    assert picks({"min_prompt_tokens": 10}, inputs(prompt_tokens=10))
    assert not picks({"min_prompt_tokens": 11}, inputs(prompt_tokens=10))
    assert picks({"max_prompt_tokens": 10}, inputs(prompt_tokens=10))
    assert not picks({"max_prompt_tokens": 9}, inputs(prompt_tokens=10))
    band = {"min_prompt_tokens": 5, "max_prompt_tokens": 20}
    assert [picks(band, inputs(prompt_tokens=n)) for n in (4, 5, 20, 21)] == [
        False,
        True,
        True,
        False,
    ]


def test_min_output_tokens_counts_an_unset_length_as_long() -> None:
    rule = {"min_output_tokens": 100}
    assert picks(rule, inputs(output_tokens=100))
    assert not picks(rule, inputs(output_tokens=99))
    assert picks(rule, inputs(output_tokens=None))


def test_header_presence_and_value() -> None:
    present = {"header": "X-Priority"}
    valued = {"header": "X-Priority", "header_value": "High"}
    assert picks(present, inputs(headers={"x-priority": ""}))
    assert not picks(present, inputs(headers={"x-other": "1"}))
    assert picks(valued, inputs(headers={"x-priority": "High"}))
    assert not picks(valued, inputs(headers={"x-priority": "high"}))
    assert not picks(valued, inputs(headers={}))


def test_header_names_match_whatever_their_case_in_the_request() -> None:
    got = route_inputs({}, {"X-PRIORITY": "High"}, chat=True, count_tokens=words)
    assert picks({"header": "x-Priority", "header_value": "High"}, got)


def test_user_regex_searches_the_user() -> None:
    rule = {"user_regex": "^team-(a|b)$"}
    assert picks(rule, inputs(user="team-b"))
    assert not picks(rule, inputs(user="team-c"))
    assert not picks(rule, inputs(user=None))
    assert picks({"user_regex": "vip"}, inputs(user="a-vip-user"))


def test_metadata_key_and_value() -> None:
    present = {"metadata_key": "tier"}
    valued = {"metadata_key": "tier", "metadata_value": "gold"}
    assert picks(present, inputs(metadata={"tier": "silver"}))
    assert not picks(present, inputs(metadata={"Tier": "gold"}))
    assert picks(valued, inputs(metadata={"tier": "gold"}))
    assert not picks(valued, inputs(metadata={"tier": "silver"}))


def test_message_regex_reads_the_last_user_message_of_a_chat() -> None:
    rule = {"message_regex": r"(?i)\bprove\b"}
    chat = {
        "messages": [
            {"role": "user", "content": "prove it"},
            {"role": "user", "content": [{"type": "text", "text": "now PROVE the lemma"}]},
        ]
    }
    assert picks(rule, route_inputs(chat, {}, chat=True, count_tokens=words))
    chat["messages"].append({"role": "user", "content": "thanks"})
    chat["messages"].append({"role": "assistant", "content": "prove"})
    assert not picks(rule, route_inputs(chat, {}, chat=True, count_tokens=words))


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [("please prove this", True), (["hello", "prove it"], True), ([1, 2, 3], False)],
)
def test_message_regex_reads_a_completion_prompt(prompt: Any, expected: bool) -> None:
    got = route_inputs({"prompt": prompt}, {}, chat=False, count_tokens=words)
    assert picks({"message_regex": "prove"}, got) is expected


# --- choose_model: order, conjunction, default ---------------------------------------------


def test_every_condition_of_a_rule_must_hold() -> None:
    rule = {"min_prompt_tokens": 5, "header": "x-team", "user_regex": "^bob$"}
    routed = inputs(prompt_tokens=5, headers={"x-team": "a"}, user="bob")
    assert picks(rule, routed)
    assert not picks(rule, replace(routed, prompt_tokens=4))
    assert not picks(rule, replace(routed, headers={}))
    assert not picks(rule, replace(routed, user="bobby"))


def test_the_first_matching_rule_wins() -> None:
    config = virtual(
        {"model": "long", "min_prompt_tokens": 1000},
        {"model": "vip", "user_regex": "vip"},
        {"model": "any-user", "user_regex": "."},
    )
    assert choose_model(config, inputs(prompt_tokens=2000, user="vip")).model == "long"
    assert choose_model(config, inputs(user="vip")).model == "vip"
    assert choose_model(config, inputs(user="joe")).model == "any-user"


def test_decisions_carry_the_rule_reason() -> None:
    config = virtual(
        {"model": "big", "name": "long-prompts", "min_prompt_tokens": 100},
        {"model": "big", "max_prompt_tokens": 3, "header": "x-a"},
    )
    assert choose_model(config, inputs(prompt_tokens=100)) == RouteDecision(
        "big", "long-prompts", None
    )
    short = inputs(prompt_tokens=3, headers={"x-a": "1"})
    assert choose_model(config, short) == RouteDecision("big", "prompt_tokens+header", None)


def test_default_when_no_rule_matches_carries_the_cascade() -> None:
    cascade = {"escalate_to": "big", "min_mean_logprob": -1.0}
    config = virtual({"model": "big", "min_prompt_tokens": 100}, cascade=cascade)
    assert config.cascade is not None
    assert choose_model(config, inputs()) == RouteDecision("small", "default", config.cascade)
    ruled = choose_model(config, inputs(prompt_tokens=100))
    assert (ruled.model, ruled.cascade) == ("big", None)


def test_default_without_rules_or_cascade() -> None:
    assert choose_model(virtual(), inputs()) == RouteDecision("small", "default", None)
