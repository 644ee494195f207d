"""OpenAI response bodies: whole completions and stream chunks, for both endpoints.

Completions use ``object: "text_completion"`` with ``choices[].text``; chat uses
``chat.completion`` / ``chat.completion.chunk`` with ``message`` / ``delta``. The first chat
chunk of each choice carries the role together with the first token's text, so a client's TTFT
is the first token's, not an empty role chunk's. ``usage`` includes
``prompt_tokens_details.cached_tokens``. With ``echo`` a completion's text (and, with
``logprobs``, its logprobs) starts with the prompt's; a stream sends the prompt in each choice's
first chunk.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cluster.ingress.dispatch.deltas import Delta, RequestUsage
from cluster.ingress.openai.logprob_format import chat_logprobs, completion_logprobs, token_texts
from core.messages import TokenLogprobs


def usage_body(usage: RequestUsage) -> dict[str, Any]:
    """The OpenAI ``usage`` object, plus pdserve's ``ttft_breakdown`` once a token is out."""
    body: dict[str, Any] = {
        "prompt_tokens": usage.num_prompt_tokens,
        "completion_tokens": usage.num_generated_tokens,
        "total_tokens": usage.num_prompt_tokens + usage.num_generated_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.num_cached_tokens},
    }
    if usage.ttft_breakdown is not None:
        body["ttft_breakdown"] = usage.ttft_breakdown.body()
    return body


@dataclass(frozen=True)
class Echo:
    """What ``echo`` puts before a choice: the prompt's text and its first token's text (the
    one position without a logprob)."""

    text: str
    first_token: str = ""


@dataclass(frozen=True)
class Choice:
    """One finished choice of a whole response."""

    text: str
    finish_reason: str | None
    logprobs: Sequence[TokenLogprobs] = ()
    prompt_logprobs: Sequence[TokenLogprobs | None] = ()
    echo: Echo | None = None


class ResponseRenderer:
    """Builds the bodies of one response (completion or chat, whole or streamed).

    ``logprobs`` is the top-N the request asked to see (None: no ``logprobs`` in the body).
    """

    def __init__(
        self, *, chat: bool, response_id: str, model: str, logprobs: int | None = None
    ) -> None:
        self.chat = chat
        self.response_id = response_id
        self.model = model
        self.logprobs = logprobs
        self.created = int(time.time())
        self._started: set[int] = set()
        self._text_offset: dict[int, int] = {}

    def full(self, text: str, finish_reason: str | None, usage: RequestUsage) -> dict[str, Any]:
        """A non-streamed response of one choice without logprobs."""
        return self.full_choices([Choice(text, finish_reason)], usage)

    def full_choices(self, choices: Sequence[Choice], usage: RequestUsage) -> dict[str, Any]:
        """A non-streamed response, choices indexed in order."""
        bodies = []
        for index, choice in enumerate(choices):
            body: dict[str, Any] = {"index": index, "finish_reason": choice.finish_reason}
            body["logprobs"] = self._whole_logprobs(choice)
            if self.chat:
                body["message"] = {"role": "assistant", "content": choice.text}
            else:
                body["text"] = (choice.echo.text if choice.echo else "") + choice.text
            bodies.append(body)
        return self._envelope("chat.completion" if self.chat else "text_completion") | {
            "choices": bodies,
            "usage": usage_body(usage),
        }

    def chunk(
        self,
        delta: Delta,
        *,
        include_usage: bool,
        index: int = 0,
        echo: Echo | None = None,
        usage: RequestUsage | None = None,
    ) -> dict[str, Any]:
        """One stream chunk for ``delta`` of choice ``index`` (``usage: null`` when usage comes
        at the end; the usage so far with ``usage``)."""
        first = index not in self._started
        self._started.add(index)
        choice: dict[str, Any] = {"index": index, "finish_reason": delta.finish_reason}
        prefix = echo.text if echo is not None and first and not self.chat else ""
        choice["logprobs"] = self._chunk_logprobs(delta, index, echo if prefix else None)
        if self.chat:
            message: dict[str, str] = {"role": "assistant"} if first else {}
            if delta.text or first:
                message["content"] = delta.text
            choice["delta"] = message
        else:
            choice["text"] = prefix + delta.text
        body = self._envelope(self._chunk_object) | {"choices": [choice]}
        if usage is not None:
            body["usage"] = usage_body(usage)
        elif include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, usage: RequestUsage) -> dict[str, Any]:
        """The final chunk of a stream with ``include_usage``: no choices, the usage."""
        return self._envelope(self._chunk_object) | {"choices": [], "usage": usage_body(usage)}

    def _whole_logprobs(self, choice: Choice) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        if self.chat:
            return chat_logprobs(choice.logprobs)
        positions: list[TokenLogprobs | None] = list(choice.logprobs)
        first_token = ""
        if choice.echo is not None and choice.prompt_logprobs:
            positions = [*choice.prompt_logprobs, *positions]
            first_token = choice.echo.first_token
        return completion_logprobs(positions, token_texts(positions, first_token))

    def _chunk_logprobs(self, delta: Delta, index: int, echo: Echo | None) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        if self.chat:
            return chat_logprobs(delta.logprobs)
        positions: list[TokenLogprobs | None] = list(delta.logprobs)
        first_token = ""
        if echo is not None and delta.prompt_logprobs:
            positions = [*delta.prompt_logprobs, *positions]
            first_token = echo.first_token
        tokens = token_texts(positions, first_token)
        offset = self._text_offset.get(index, 0)
        self._text_offset[index] = offset + sum(len(t) for t in tokens)
        return completion_logprobs(positions, tokens, offset)

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.response_id, "object": obj, "created": self.created, "model": self.model}
