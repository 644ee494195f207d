"""A whole response replayed as stream chunks, for a streamed request that the cascade answered
only once the cheap model's whole answer was in.

The chunks have the shapes ``cluster.ingress.openai.responses`` streams: the same ``id``,
``created`` and ``model`` on each; ``usage: null`` on every chunk but the last with
``include_usage`` (and no ``usage`` key without it); a final usage chunk with no choices. A
completions choice is one chunk (its whole text, logprobs and finish reason). A chat choice is two:
the role with the whole text and its logprobs, then an empty delta with the finish reason (and, when
the choice has logprobs, an empty ``content`` list, as a finish-only delta streams).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COMPLETION_OBJECT = "text_completion"
CHAT_CHUNK_OBJECT = "chat.completion.chunk"


def as_stream_chunks(
    body: Mapping[str, Any], *, chat: bool, include_usage: bool
) -> list[dict[str, Any]]:
    """The chunk objects (each sent as one SSE event, before ``[DONE]``) a stream of the whole
    chat or completions response ``body`` would have sent."""
    envelope = _envelope(body, CHAT_CHUNK_OBJECT if chat else COMPLETION_OBJECT)
    chunks: list[dict[str, Any]] = []
    for position, choice in enumerate(_choices(body)):
        index = choice.get("index", position)
        choice_chunks = _chat_choice(choice, index) if chat else [_completion_choice(choice, index)]
        for choice_chunk in choice_chunks:
            chunk = envelope | {"choices": [choice_chunk]}
            if include_usage:
                chunk["usage"] = None
            chunks.append(chunk)
    if include_usage:
        chunks.append(envelope | {"choices": [], "usage": body.get("usage")})
    return chunks


def _completion_choice(choice: Mapping[str, Any], index: object) -> dict[str, Any]:
    return {
        "index": index,
        "finish_reason": choice.get("finish_reason"),
        "logprobs": choice.get("logprobs"),
        "text": choice.get("text", ""),
    }


def _chat_choice(choice: Mapping[str, Any], index: object) -> list[dict[str, Any]]:
    message = choice.get("message")
    content = message.get("content") if isinstance(message, Mapping) else None
    logprobs = choice.get("logprobs")
    text = {
        "index": index,
        "finish_reason": None,
        "logprobs": logprobs,
        "delta": {"role": "assistant", "content": content if isinstance(content, str) else ""},
    }
    finish = {
        "index": index,
        "finish_reason": choice.get("finish_reason"),
        "logprobs": None if logprobs is None else {"content": []},
        "delta": {},
    }
    return [text, finish]


def _envelope(body: Mapping[str, Any], obj: str) -> dict[str, Any]:
    envelope = {
        "id": body.get("id"),
        "object": obj,
        "created": body.get("created"),
        "model": body.get("model"),
    }
    if "system_fingerprint" in body:
        envelope["system_fingerprint"] = body["system_fingerprint"]
    return envelope


def _choices(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    choices = body.get("choices")
    if not isinstance(choices, list):
        return []
    return [choice for choice in choices if isinstance(choice, Mapping)]
