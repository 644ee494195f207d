"""Virtual model names: ``model: auto`` sent to one of the served models by rules in the YAML.

A virtual model has a ``default`` model, ordered ``rules`` (the first that matches picks its
model) and an optional ``cascade``: a request no rule claimed goes to the default (cheap) model
first and is answered again by ``cascade.escalate_to`` when a check on the cheap answer fires.
Every condition set on a rule must hold for it to match. ``cluster.ingress.model_routing``
evaluates these; the cluster schema checks that every model named here is served.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from core.config.base import StrictModel

DEFAULT_REASON = "default"
"""No rule matched: the virtual model's default answered."""
NAMED_REASON = "named"
"""The request named a served model (not counted: it is no routing decision)."""
ACCEPTED_REASON = "cascade_accepted"
"""A cascade kept the default model's answer."""
ESCALATED_PREFIX = "escalated_"
"""A cascade escalated: ``escalated_length``, ``escalated_refusal``, ``escalated_low_logprob``."""
RESERVED_REASONS = frozenset({DEFAULT_REASON, NAMED_REASON, ACCEPTED_REASON})
"""Reasons the ingress reports itself (plus the escalations); no rule may be named so."""


def _compiles(pattern: str | None) -> str | None:
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as e:
            raise ValueError(f"invalid regular expression {pattern!r}: {e}") from e
    return pattern


class RouteRuleConfig(StrictModel):
    """One rule: when every condition set here holds, the request goes to ``model``."""

    model: str = Field(..., min_length=1, description="The served model this rule picks.")
    name: str | None = Field(
        None,
        min_length=1,
        description="The reason counted and sent in x-pdserve-route-reason; default: the "
        "conditions' kinds joined (e.g. prompt_tokens).",
    )
    min_prompt_tokens: int | None = Field(
        None, ge=0, description="Matches prompts of at least this many tokens."
    )
    max_prompt_tokens: int | None = Field(
        None, ge=0, description="Matches prompts of at most this many tokens."
    )
    min_output_tokens: int | None = Field(
        None,
        ge=1,
        description="Matches requests whose estimated output (max_completion_tokens, else "
        "max_tokens; unset counts as the model's whole context) is at least this long.",
    )
    header: str | None = Field(
        None,
        min_length=1,
        description="A request header the rule reads (with header_value, or any value).",
    )
    header_value: str | None = Field(
        None, description="The value header must have; None: the header's presence matches."
    )
    user_regex: str | None = Field(
        None, description="Matches when the request's user field matches this regex."
    )
    metadata_key: str | None = Field(
        None, min_length=1, description="A key of the request's metadata object to read."
    )
    metadata_value: str | None = Field(
        None, description="The value metadata_key must have; None: its presence matches."
    )
    message_regex: str | None = Field(
        None,
        description="Matches when the last user message (chat) or the prompt text "
        "(completions) matches this regex (re.search).",
    )

    _regexes_compile = field_validator("user_regex", "message_regex")(_compiles)

    @model_validator(mode="after")
    def _has_a_condition(self) -> RouteRuleConfig:
        if self.header_value is not None and self.header is None:
            raise ValueError("header_value needs header")
        if self.metadata_value is not None and self.metadata_key is None:
            raise ValueError("metadata_value needs metadata_key")
        if not self.kinds():
            raise ValueError("a rule needs at least one condition")
        low, high = self.min_prompt_tokens, self.max_prompt_tokens
        if low is not None and high is not None and low > high:
            raise ValueError(
                f"min_prompt_tokens ({low}) > max_prompt_tokens ({high}): never matches"
            )
        if self.reason in RESERVED_REASONS or self.reason.startswith(ESCALATED_PREFIX):
            raise ValueError(f"name {self.reason!r} is one of the reasons pdserve itself reports")
        return self

    def kinds(self) -> tuple[str, ...]:
        """The kinds of the conditions set, in a fixed order."""
        kinds = {
            "prompt_tokens": (self.min_prompt_tokens, self.max_prompt_tokens),
            "output_tokens": (self.min_output_tokens,),
            "header": (self.header,),
            "user": (self.user_regex,),
            "metadata": (self.metadata_key,),
            "message": (self.message_regex,),
        }
        return tuple(k for k, values in kinds.items() if any(v is not None for v in values))

    @property
    def reason(self) -> str:
        """What a match is counted as."""
        return self.name or "+".join(self.kinds())


class CascadeConfig(StrictModel):
    """Answer with the default model first; escalate when a check on its answer fires."""

    escalate_to: str = Field(..., min_length=1, description="The served model escalated to.")
    on_length: bool = Field(
        True, description="Escalate when the cheap answer stopped at max_tokens (length)."
    )
    refusal_regex: str | None = Field(
        None, description="Escalate when the cheap answer's text matches this regex."
    )
    min_mean_logprob: float | None = Field(
        None,
        le=0.0,
        description="Escalate when the mean log-probability of the cheap answer's tokens is "
        "below this (the answer is unsure); None: no such check.",
    )

    _regex_compiles = field_validator("refusal_regex")(_compiles)


class VirtualModelConfig(StrictModel):
    """A model name that is not one model: requests to it are routed to a served one."""

    name: str = Field(..., min_length=1, description="The name clients send (e.g. auto).")
    default: str = Field(
        ..., min_length=1, description="The served model a request goes to when no rule fires."
    )
    rules: tuple[RouteRuleConfig, ...] = Field(
        (), description="Tried in order; the first whose conditions all hold picks the model."
    )
    cascade: CascadeConfig | None = Field(
        None,
        description="Requests no rule claimed are answered by default first and escalated "
        "when a check on that answer fires; None: no cascade.",
    )

    @model_validator(mode="after")
    def _cascade_goes_up(self) -> VirtualModelConfig:
        if self.cascade is not None and self.cascade.escalate_to == self.default:
            raise ValueError(
                f"cascade.escalate_to is the default model {self.default!r}: escalate to another"
            )
        return self

    def models(self) -> list[tuple[str, str]]:
        """``(field, model)`` of every served model this virtual model names."""
        named = [("default", self.default)]
        named += [(f"rules[{i}].model", rule.model) for i, rule in enumerate(self.rules)]
        if self.cascade is not None:
            named.append(("cascade.escalate_to", self.cascade.escalate_to))
        return named
