"""OpenAI response bodies: whole completions and stream chunks, for both endpoints.

Completions use ``object: "text_completion"`` with ``choices[].text``; chat uses
``chat.completion`` / ``chat.completion.chunk`` with ``message`` / ``delta``. The first chat
chunk carries the role together with the first token's text, so a client's TTFT is the first
token's, not an empty role chunk's. ``usage`` includes ``prompt_tokens_details.cached_tokens``.
"""

from __future__ import annotations

import time
from typing import Any

from cluster.ingress.flow import Delta, RequestUsage


def usage_body(usage: RequestUsage) -> dict[str, Any]:
    """The OpenAI ``usage`` object."""
    return {
        "prompt_tokens": usage.num_prompt_tokens,
        "completion_tokens": usage.num_generated_tokens,
        "total_tokens": usage.num_prompt_tokens + usage.num_generated_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.num_cached_tokens},
    }


class ResponseRenderer:
    """Builds the bodies of one response (completion or chat, whole or streamed)."""

    def __init__(self, *, chat: bool, response_id: str, model: str) -> None:
        self.chat = chat
        self.response_id = response_id
        self.model = model
        self.created = int(time.time())
        self._sent_role = False

    def full(self, text: str, finish_reason: str | None, usage: RequestUsage) -> dict[str, Any]:
        """A non-streamed response."""
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return self._envelope("chat.completion" if self.chat else "text_completion") | {
            "choices": [choice],
            "usage": usage_body(usage),
        }

    def chunk(self, delta: Delta, *, include_usage: bool) -> dict[str, Any]:
        """One stream chunk for ``delta`` (``usage: null`` when usage comes at the end)."""
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": None,
            "finish_reason": delta.finish_reason,
        }
        if self.chat:
            message: dict[str, str] = {}
            if not self._sent_role:
                message["role"] = "assistant"
                self._sent_role = True
            if delta.text or "role" in message:
                message["content"] = delta.text
            choice["delta"] = message
        else:
            choice["text"] = delta.text
        body = self._envelope(self._chunk_object) | {"choices": [choice]}
        if include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, usage: RequestUsage) -> dict[str, Any]:
        """The final chunk of a stream with ``include_usage``: no choices, the usage."""
        return self._envelope(self._chunk_object) | {"choices": [], "usage": usage_body(usage)}

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def _envelope(self, obj: str) -> dict[str, Any]:
        return {"id": self.response_id, "object": obj, "created": self.created, "model": self.model}
