"""Chat templates: validate OpenAI-style messages and render them with a sandboxed jinja2.

A model's chat template is code shipped with the checkpoint, so it runs in jinja2's
``ImmutableSandboxedEnvironment`` (no attribute access to internals, no mutation of the inputs),
made strict: any unsafe access raises instead of rendering as empty.
The environment mirrors HF's (``trim_blocks``/``lstrip_blocks``, ``loopcontrols``,
``raise_exception``, ``strftime_now``, a non-ASCII-escaping ``tojson``) so real templates render
exactly as with ``transformers``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from core.errors import ConfigError, InvalidRequestError


class TemplateRaisedError(jinja2.TemplateError):
    """A template called ``raise_exception(message)``: it refuses the conversation."""


def _raise_exception(message: str) -> None:
    raise TemplateRaisedError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, but reading an unsafe attribute raises at once.

    jinja2's default renders such a read as an empty undefined and fails only on further use;
    refusing outright surfaces a hostile or broken template instead of rendering around it.
    """

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} is unsafe"
        )


def _environment() -> ImmutableSandboxedEnvironment:
    env = _StrictSandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols], autoescape=False
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template plus the special tokens it may refer to (``bos_token`` ...)."""

    def __init__(self, source: str, special_tokens: Mapping[str, str | None]) -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ConfigError(
                f"chat template has a syntax error at line {e.lineno}: {e.message}",
                param="chat_template",
            ) from e
        # NOTE: an absent token stays undefined (renders as ""), never as the string "None".
        self._special_tokens = {k: v for k, v in special_tokens.items() if v is not None}

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text for ``messages`` (validated first; errors name the field)."""
        context: dict[str, Any] = {**self._special_tokens, **(template_kwargs or {})}
        context["messages"] = validate_messages(messages)
        context["add_generation_prompt"] = add_generation_prompt
        try:
            return self._template.render(**context)
        except SecurityError as e:
            raise ConfigError(
                f"chat template attempted an unsafe operation and was stopped: {e}",
                param="chat_template",
            ) from e
        except TemplateRaisedError as e:
            raise InvalidRequestError(
                f"the chat template rejected the messages: {e.message}", param="messages"
            ) from e
        except (jinja2.TemplateError, TypeError, ValueError, KeyError) as e:
            raise InvalidRequestError(
                f"cannot render the chat template for these messages: {e}", param="messages"
            ) from e


def validate_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Plain-dict copies of ``messages`` with text content flattened to one string.

    Raises :class:`InvalidRequestError` naming the offending field (``messages[2].role``).
    """
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise InvalidRequestError("messages must be a non-empty list", param="messages")
    return [_validate_message(i, m) for i, m in enumerate(messages)]


def _validate_message(index: int, message: Any) -> dict[str, Any]:
    field = f"messages[{index}]"
    if not isinstance(message, Mapping):
        raise InvalidRequestError(f"{field} must be an object", param=field)
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise InvalidRequestError(f"{field}.role must be a non-empty string", param=f"{field}.role")
    result = dict(message)
    result["content"] = _flatten_content(field, message.get("content"))
    return result


def _flatten_content(field: str, content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, bytes):
        return "\n".join(_text_part(f"{field}.content[{j}]", p) for j, p in enumerate(content))
    raise InvalidRequestError(
        f"{field}.content must be a string or a list of text parts", param=f"{field}.content"
    )


def _text_part(field: str, part: Any) -> str:
    if not isinstance(part, Mapping) or part.get("type") != "text":
        raise InvalidRequestError(
            f"{field} must be a text part ({{'type': 'text', 'text': ...}}); "
            "only text content is supported",
            param=f"{field}.type",
        )
    text = part.get("text")
    if not isinstance(text, str):
        raise InvalidRequestError(f"{field}.text must be a string", param=f"{field}.text")
    return text
