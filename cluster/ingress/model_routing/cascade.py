"""The cascade's checks: is the cheap model's whole answer good enough, or is it escalated?

The cheap answer is a full (non-streamed) OpenAI response body. ``summarize_answer`` reads what
the checks need from it; ``escalation_reason`` runs the checks in a fixed order (length, refusal,
low log-probability). The log-probability check needs the sampled tokens' logprobs, so the cheap
request asks for them (``with_logprobs``) and, when the client did not, the answer it gets back
has them removed (``strip_logprobs``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster.ingress.model_routing.policy import compiled_regex
from core.config.virtual_models import CascadeConfig


@dataclass(frozen=True)
class AnswerSummary:
    """What the cascade's checks read from one whole answer."""

    finish_reasons: tuple[str | None, ...]
    """One per choice."""
    text: str
    """Every choice's text, joined by newlines."""
    token_logprobs: tuple[float, ...]
    """The logprob of every sampled token of every choice; empty when the answer has none."""


def summarize_answer(body: Mapping[str, Any], *, chat: bool) -> AnswerSummary:
    """The summary of a whole chat or completions response body (a malformed one reads as
    empty, never raises)."""
    finish_reasons: list[str | None] = []
    texts: list[str] = []
    logprobs: list[float] = []
    for choice in _list(body.get("choices")):
        if not isinstance(choice, Mapping):
            continue
        reason = choice.get("finish_reason")
        finish_reasons.append(reason if isinstance(reason, str) else None)
        message = _mapping(choice.get("message")) if chat else choice
        text = message.get("content" if chat else "text")
        texts.append(text if isinstance(text, str) else "")
        logprobs.extend(_chosen_logprobs(_mapping(choice.get("logprobs")), chat=chat))
    return AnswerSummary(tuple(finish_reasons), "\n".join(texts), tuple(logprobs))


def escalation_reason(cascade: CascadeConfig, answer: AnswerSummary) -> str | None:
    """Why the answer is escalated to ``cascade.escalate_to`` (``"length"``, ``"refusal"`` or
    ``"low_logprob"``, the first check that fires), or None to keep it."""
    if cascade.on_length and "length" in answer.finish_reasons:
        return "length"
    refusal = cascade.refusal_regex
    if refusal is not None and compiled_regex(refusal).search(answer.text) is not None:
        return "refusal"
    floor = cascade.min_mean_logprob
    logprobs = answer.token_logprobs
    # NOTE: an answer without logprobs (or without tokens) passes this check.
    if floor is not None and logprobs and sum(logprobs) / len(logprobs) < floor:
        return "low_logprob"
    return None


def needs_logprobs(cascade: CascadeConfig) -> bool:
    """Whether the cascade's checks read the cheap answer's token logprobs."""
    return cascade.min_mean_logprob is not None


def with_logprobs(data: Mapping[str, Any], *, chat: bool) -> dict[str, Any]:
    """A copy of request body ``data`` that asks for each sampled token's logprob (and no
    alternatives) when the client did not ask for logprobs; what it asked is kept.

    A chat body with ``top_logprobs`` but without ``logprobs`` is left as it is, so validation
    still rejects it.
    """
    body = dict(data)
    if chat and not body.get("logprobs") and not body.get("top_logprobs"):
        body["logprobs"] = True
        body["top_logprobs"] = 0
    elif not chat and body.get("logprobs") is None:
        body["logprobs"] = 0
    return body


def strip_logprobs(body: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of response ``body`` with every choice's ``logprobs`` null (for a client that did
    not ask for them)."""
    choices = [
        {**choice, "logprobs": None} if isinstance(choice, Mapping) else choice
        for choice in _list(body.get("choices"))
    ]
    return {**body, "choices": choices}


def _chosen_logprobs(logprobs: Mapping[str, Any], *, chat: bool) -> list[float]:
    """The sampled tokens' logprobs of one choice's ``logprobs`` object (nulls skipped)."""
    if chat:
        values = [_mapping(entry).get("logprob") for entry in _list(logprobs.get("content"))]
    else:
        values = _list(logprobs.get("token_logprobs"))
    return [float(v) for v in values if isinstance(v, int | float) and not isinstance(v, bool)]


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
