"""Which served model a request to a virtual model goes to: its rules, read off the request.

``route_inputs`` reads what the rules look at from a parsed OpenAI body and its headers, before
the body is validated, so it never raises on a malformed body (a field of the wrong shape reads
as absent; validation rejects the request later). ``choose_model`` tries the virtual model's
rules in order and returns the first match's model, else the default (with the cascade, if any).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from core.config.virtual_models import (
    DEFAULT_REASON,
    CascadeConfig,
    RouteRuleConfig,
    VirtualModelConfig,
)


@dataclass(frozen=True)
class RouteInputs:
    """What the rules of a virtual model read from one request."""

    prompt_tokens: int
    """An estimate: the messages' text (chat) or the prompt, without the chat template."""
    output_tokens: int | None
    """``max_completion_tokens``, else ``max_tokens``; None when neither is set."""
    headers: Mapping[str, str]
    """The request's headers, names lower-case."""
    user: str | None
    metadata: Mapping[str, str]
    """The string-valued entries of the request's ``metadata`` object."""
    message_text: str
    """The last user message's text (chat) or the prompt's text (completions)."""


@dataclass(frozen=True)
class RouteDecision:
    """The served model a request goes to, and why."""

    model: str
    reason: str
    """The matching rule's ``reason``, or ``"default"``."""
    cascade: CascadeConfig | None = None
    """Set only when no rule matched and the virtual model has a cascade."""


def route_inputs(
    data: Mapping[str, Any],
    headers: Mapping[str, str],
    *,
    chat: bool,
    count_tokens: Callable[[str], int],
) -> RouteInputs:
    """The route inputs of a parsed request body ``data`` (chat or completions) and its headers;
    ``count_tokens`` counts the tokens of a text."""
    if chat:
        messages = _list(data.get("messages"))
        texts = [_content_text(m.get("content")) for m in messages if isinstance(m, Mapping)]
        prompt_tokens = count_tokens("\n".join(t for t in texts if t))
        message_text = _last_user_text(messages)
    else:
        prompt = data.get("prompt")
        prompt_tokens = _prompt_tokens(prompt, count_tokens)
        message_text = _prompt_text(prompt)
    output_tokens = _int(data.get("max_completion_tokens"))
    if output_tokens is None:
        output_tokens = _int(data.get("max_tokens"))
    metadata = data.get("metadata")
    user = data.get("user")
    return RouteInputs(
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        headers={name.lower(): value for name, value in headers.items()},
        user=user if isinstance(user, str) else None,
        metadata=_string_entries(metadata) if isinstance(metadata, Mapping) else {},
        message_text=message_text,
    )


def choose_model(virtual: VirtualModelConfig, inputs: RouteInputs) -> RouteDecision:
    """The first rule of ``virtual`` whose conditions all hold picks the model; else its
    default, with its cascade."""
    for rule in virtual.rules:
        if _matches(rule, inputs):
            return RouteDecision(model=rule.model, reason=rule.reason)
    return RouteDecision(model=virtual.default, reason=DEFAULT_REASON, cascade=virtual.cascade)


def _matches(rule: RouteRuleConfig, inputs: RouteInputs) -> bool:
    # NOTE: an unset output length is the model's whole context: longer than any minimum.
    output_tokens = inputs.output_tokens
    return (
        (rule.min_prompt_tokens is None or inputs.prompt_tokens >= rule.min_prompt_tokens)
        and (rule.max_prompt_tokens is None or inputs.prompt_tokens <= rule.max_prompt_tokens)
        and (
            rule.min_output_tokens is None
            or output_tokens is None
            or output_tokens >= rule.min_output_tokens
        )
        and _has_entry(inputs.headers, rule.header and rule.header.lower(), rule.header_value)
        and _searches(rule.user_regex, inputs.user)
        and _has_entry(inputs.metadata, rule.metadata_key, rule.metadata_value)
        and _searches(rule.message_regex, inputs.message_text)
    )


def _has_entry(entries: Mapping[str, str], key: str | None, value: str | None) -> bool:
    """No key: no condition; else the key is there and, when ``value`` is set, has it."""
    if key is None:
        return True
    return key in entries and (value is None or entries[key] == value)


def _searches(pattern: str | None, text: str | None) -> bool:
    if pattern is None:
        return True
    return text is not None and compiled_regex(pattern).search(text) is not None


@functools.lru_cache(maxsize=256)
def compiled_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled once (the schema has checked that it compiles)."""
    return re.compile(pattern)


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _string_entries(entries: Mapping[Any, Any]) -> dict[str, str]:
    return {k: v for k, v in entries.items() if isinstance(k, str) and isinstance(v, str)}


def _content_text(content: object) -> str:
    """A message's text: its string content, or its text parts joined by newlines."""
    if isinstance(content, str):
        return content
    parts = [
        part.get("text")
        for part in _list(content)
        if isinstance(part, Mapping) and part.get("type") == "text"
    ]
    return "\n".join(text for text in parts if isinstance(text, str))


def _last_user_text(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, Mapping) and message.get("role") == "user":
            return _content_text(message.get("content"))
    return ""


def _prompt_text(prompt: object) -> str:
    """A string prompt, a batch's strings joined by newlines; token ids have no text."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(p for p in _list(prompt) if isinstance(p, str))


def _prompt_tokens(prompt: object, count_tokens: Callable[[str], int]) -> int:
    """A prompt's tokens: a batch's (strings or token-id lists) longest."""
    if isinstance(prompt, str):
        return count_tokens(prompt)
    items = _list(prompt)
    if all(_int(item) is not None for item in items):
        return len(items)
    sizes = [
        count_tokens(item) if isinstance(item, str) else len(item)
        for item in items
        if isinstance(item, str | list)
    ]
    return max(sizes, default=0)
