"""Logprobs in the OpenAI shapes, from the typed ``TokenLogprobs`` the roles send.

Completions (the legacy shape): ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``,
one entry per token; with ``echo`` the prompt's tokens come first, the very first of them with
``null`` logprobs (nothing precedes it). Chat: ``{"content": [{"token", "logprob", "bytes",
"top_logprobs": [...]}]}``. A streamed chunk carries the entries of its own tokens; a completion
chunk's ``text_offset`` continues from the text already sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.messages import TokenLogprobs


def completion_logprobs(
    positions: Sequence[TokenLogprobs | None],
    tokens: Sequence[str],
    text_offset: int = 0,
) -> dict[str, Any]:
    """The completions ``logprobs`` object of ``positions`` whose token texts are ``tokens``
    (a None position, the first prompt token, has null logprobs)."""
    offsets, at = [], text_offset
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {
        "tokens": list(tokens),
        "token_logprobs": [None if p is None else p.chosen.logprob for p in positions],
        "top_logprobs": [
            None if p is None else {e.token: e.logprob for e in p.top} for p in positions
        ],
        "text_offset": offsets,
    }


def chat_logprobs(positions: Sequence[TokenLogprobs]) -> dict[str, Any]:
    """The chat ``logprobs`` object: ``content`` with one entry per generated token."""
    content = [
        {**_entry(p.chosen.token, p.chosen.logprob),
         "top_logprobs": [_entry(e.token, e.logprob) for e in p.top]}
        for p in positions
    ]  # fmt: skip
    return {"content": content}


def token_texts(positions: Sequence[TokenLogprobs | None], first_token: str) -> list[str]:
    """Each position's token text; ``first_token`` stands in for a None (the first prompt one)."""
    return [first_token if p is None else p.chosen.token for p in positions]


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}
