"""Admission checks: everything that can refuse a request, run before it enters any queue.

:func:`check_request` names the offending field with a typed ``InvalidRequestError``;
:func:`request_generator` builds a seeded request's generator up front. ``LLMEngine`` calls both
before the scheduler sees the request, so a refusal never leaves a half-admitted request behind.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from core.errors import InvalidRequestError, SamplingParamsError
from core.sampling import SamplingParams
from engine.sampling import make_generator


def check_request(
    request_id: str,
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    *,
    vocab_size: int,
    first_token_id: int | None = None,
) -> None:
    """Raise ``InvalidRequestError`` (naming the field) unless the request can be admitted: a
    string id, ``SamplingParams``, a non-empty prompt, every token id (``first_token_id`` too)
    in ``[0, vocab_size)``, ``n == 1`` (``LLM.generate`` fans ``n`` out into that many engine
    requests), ``logprobs`` within the vocab. The prompt's length against
    ``max_model_len`` is the scheduler's check (``PromptTooLongError``), also run before it
    queues anything."""
    if not isinstance(request_id, str) or not request_id:
        raise InvalidRequestError(
            f"request_id must be a non-empty string, got {request_id!r}", param="request_id"
        )
    if not isinstance(params, SamplingParams):
        raise InvalidRequestError(
            f"request {request_id}: sampling_params must be SamplingParams, got "
            f"{type(params).__name__}",
            param="sampling_params",
        )
    if not prompt_token_ids:
        raise InvalidRequestError(f"request {request_id}: the prompt is empty", param="prompt")
    _check_prompt_ids(request_id, prompt_token_ids, vocab_size)
    if first_token_id is not None:
        param = "first_token_id"
        _check_token_id(request_id, first_token_id, vocab_size, param, param)
    if params.n != 1:
        raise SamplingParamsError(
            f"request {request_id}: an engine request generates one sequence, got n={params.n} "
            "(LLM.generate runs n requests per prompt)",
            param="n",
        )
    if params.logprobs is not None and params.logprobs > vocab_size:
        raise SamplingParamsError(
            f"request {request_id}: logprobs={params.logprobs} exceeds the vocabulary "
            f"({vocab_size} tokens)",
            param="logprobs",
        )
    outside = [token_id for token_id, _ in params.logit_bias if token_id >= vocab_size]
    if outside:
        raise SamplingParamsError(
            f"request {request_id}: logit_bias names token {outside[0]}, outside the vocabulary "
            f"({vocab_size} tokens)",
            param="logit_bias",
        )


def request_generator(params: SamplingParams, *, num_draws: int = 0) -> torch.Generator | None:
    """A seeded request's own generator (None when unseeded), advanced past ``num_draws``
    draws made elsewhere (an imported request's first token was drawn on the prefill side)."""
    if params.seed is None:
        return None
    generator = make_generator(params.seed)
    if num_draws:
        torch.rand(num_draws, generator=generator, dtype=torch.float64)
    return generator


def _check_prompt_ids(request_id: str, token_ids: Sequence[int], vocab_size: int) -> None:
    """Every prompt id a token of the model (see :func:`_check_token_id`)."""
    if set(map(type, token_ids)) <= {int} and min(token_ids) >= 0 and max(token_ids) < vocab_size:
        return  # NOTE: the fast path runs C loops; the slow one only finds the offender
    for position, token_id in enumerate(token_ids):
        _check_token_id(
            request_id, token_id, vocab_size, f"prompt_token_ids[{position}]", "prompt_token_ids"
        )


def _check_token_id(
    request_id: str, token_id: object, vocab_size: int, where: str, param: str
) -> None:
    """An ``int`` (not a bool) in ``[0, vocab_size)``: a row of the model's embedding."""
    if type(token_id) is not int or not 0 <= token_id < vocab_size:
        raise InvalidRequestError(
            f"request {request_id}: {where} = {token_id!r} is not a token id of this model "
            f"(0 <= id < {vocab_size})",
            param=param,
        )
