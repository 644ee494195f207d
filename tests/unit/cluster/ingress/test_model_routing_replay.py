"""A whole answer replayed as stream chunks: the chunks pdserve's own renderer streams for the
same answer, and chunks the official ``openai`` client parses back into the same answer."""

from __future__ import annotations

from typing import Any

import openai.types as oai
import openai.types.chat as oai_chat
import pytest

from cluster.ingress.dispatch.deltas import Delta, RequestUsage
from cluster.ingress.model_routing import as_stream_chunks
from cluster.ingress.openai.responses import Choice, ResponseRenderer
from core.messages import LogprobEntry, TokenLogprobs

USAGE = RequestUsage(num_prompt_tokens=7, num_cached_tokens=2, num_generated_tokens=5)


def position(token_id: int, token: str, logprob: float) -> TokenLogprobs:
    alternative = LogprobEntry(token_id + 1, token.upper(), logprob - 1.0)
    return TokenLogprobs(LogprobEntry(token_id, token, logprob), (alternative,))


HELLO = [position(1, "he", -0.1), position(2, "llo", -0.2)]
WORLD = [position(3, " wor", -0.3), position(4, "l", -0.4), position(5, "d", -0.5)]
ANSWERS = [(HELLO, "hello", "stop"), (WORLD, " world", "length")]


def renderer(*, chat: bool, logprobs: int | None) -> ResponseRenderer:
    return ResponseRenderer(chat=chat, response_id="r-1", model="small", logprobs=logprobs)


def whole_body(*, chat: bool, logprobs: int | None) -> dict[str, Any]:
    choices = [Choice(text, reason, tuple(positions)) for positions, text, reason in ANSWERS]
    return renderer(chat=chat, logprobs=logprobs).full_choices(choices, USAGE)


def streamed(*, chat: bool, logprobs: int | None, include_usage: bool) -> list[dict[str, Any]]:
    """What pdserve streams for ANSWERS: a choice's whole text (for chat, then its finish)."""
    stream = renderer(chat=chat, logprobs=logprobs)
    chunks = []
    for index, (positions, text, reason) in enumerate(ANSWERS):
        ids = [p.chosen.token_id for p in positions]
        if chat:
            deltas = [Delta(ids, text, None, tuple(positions)), Delta([], "", reason)]
        else:
            deltas = [Delta(ids, text, reason, tuple(positions))]
        chunks += [stream.chunk(d, include_usage=include_usage, index=index) for d in deltas]
    if include_usage:
        chunks.append(stream.usage_chunk(USAGE))
    return chunks


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("logprobs", [None, 0])
def test_replay_is_what_pdserve_streams(
    chat: bool, include_usage: bool, logprobs: int | None
) -> None:
    body = whole_body(chat=chat, logprobs=logprobs)
    replayed = as_stream_chunks(body, chat=chat, include_usage=include_usage)
    expected = streamed(chat=chat, logprobs=logprobs, include_usage=include_usage)
    for chunk in expected:
        chunk["created"] = body["created"]
    assert replayed == expected


def test_chat_chunk_shapes() -> None:
    body = whole_body(chat=True, logprobs=None) | {"system_fingerprint": "fp-1"}
    chunks = as_stream_chunks(body, chat=True, include_usage=True)
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 5
    assert {c["system_fingerprint"] for c in chunks} == {"fp-1"}
    assert [c["choices"] for c in chunks] == [
        [{"index": 0, "finish_reason": None, "logprobs": None,
          "delta": {"role": "assistant", "content": "hello"}}],
        [{"index": 0, "finish_reason": "stop", "logprobs": None, "delta": {}}],
        [{"index": 1, "finish_reason": None, "logprobs": None,
          "delta": {"role": "assistant", "content": " world"}}],
        [{"index": 1, "finish_reason": "length", "logprobs": None, "delta": {}}],
        [],
    ]  # fmt: skip
    assert [c["usage"] for c in chunks[:4]] == [None] * 4
    assert chunks[4]["usage"] == body["usage"]


def test_completion_chunk_shapes_without_usage() -> None:
    body = whole_body(chat=False, logprobs=None)
    chunks = as_stream_chunks(body, chat=False, include_usage=False)
    assert [c["choices"] for c in chunks] == [
        [{"index": 0, "finish_reason": "stop", "logprobs": None, "text": "hello"}],
        [{"index": 1, "finish_reason": "length", "logprobs": None, "text": " world"}],
    ]
    envelope = {"id": "r-1", "object": "text_completion", "created": body["created"]}
    for chunk in chunks:
        assert chunk.items() >= (envelope | {"model": "small"}).items()
        assert "usage" not in chunk
        assert "system_fingerprint" not in chunk


def test_malformed_body_replays_what_it_can() -> None:
    body = {"id": "x", "choices": [None, {"message": None}], "usage": None}
    chunks = as_stream_chunks(body, chat=True, include_usage=False)
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {},
    ]
    assert as_stream_chunks({"choices": "x"}, chat=False, include_usage=False) == []


@pytest.mark.parametrize("logprobs", [None, 0])
def test_openai_client_reads_the_chat_replay_back(logprobs: int | None) -> None:
    body = whole_body(chat=True, logprobs=logprobs)
    chunks = [
        oai_chat.ChatCompletionChunk.model_validate(c)
        for c in as_stream_chunks(body, chat=True, include_usage=True)
    ]
    whole = oai_chat.ChatCompletion.model_validate(body)
    for choice in whole.choices:
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == choice.index]
        assert "".join(c.delta.content or "" for c in mine) == choice.message.content
        assert [c.finish_reason for c in mine if c.finish_reason] == [choice.finish_reason]
        tokens = [e for c in mine if c.logprobs and c.logprobs.content for e in c.logprobs.content]
        assert tokens == (choice.logprobs.content if choice.logprobs else [])
    assert chunks[-1].usage == whole.usage


def test_openai_client_reads_the_completion_replay_back() -> None:
    body = whole_body(chat=False, logprobs=0)
    chunks = [
        oai.Completion.model_validate(c)
        for c in as_stream_chunks(body, chat=False, include_usage=True)
    ]
    whole = oai.Completion.model_validate(body)
    assert [c.choices[0] for c in chunks[:-1]] == whole.choices
    assert chunks[-1].usage == whole.usage
