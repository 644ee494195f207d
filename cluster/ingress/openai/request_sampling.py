"""An OpenAI / vLLM request body's sampling fields -> the engine's :class:`SamplingParams`.

The fields are named as vLLM names them (``repetition_penalty``, ``min_tokens``,
``stop_token_ids``, ``ignore_eos``, ...); the OpenAI ones take OpenAI's defaults when absent.
Values were range-checked by the schema; what only makes sense together is checked by
``SamplingParams`` itself, and each error names the field.
"""

from __future__ import annotations

from typing import Any

from cluster.ingress.openai.schemas import GenerationRequest
from cluster.ingress.openai.structured import structured_output
from core.errors import SamplingParamsError
from core.sampling import SamplingParams


def sampling_params(body: GenerationRequest, max_tokens: int, vocab_size: int) -> SamplingParams:
    """The sampling parameters ``body`` asks for, with its output budget ``max_tokens``; a
    ``logit_bias`` id outside the model's ``vocab_size`` is refused here, before any worker."""
    outside = [t for t in body.logit_bias or {} if t.isdigit() and int(t) >= vocab_size]
    if outside:
        raise SamplingParamsError(
            f"logit_bias names token {outside[0]}, outside the vocabulary (size {vocab_size})",
            param="logit_bias",
        )
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        seed=body.seed,
        stop=stop_strings(body.stop),
        stop_token_ids=tuple(body.stop_token_ids or ()),
        ignore_eos=bool(body.ignore_eos),
        logprobs=body.sampling_logprobs(),
        prompt_logprobs=body.sampling_prompt_logprobs(),
        min_tokens=body.min_tokens or 0,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        logit_bias=body.logit_bias or {},  # type: ignore[arg-type]  # validated there
        structured_output=structured_output(body),
        kv_keep_alive_s=body.kv_keep_alive_s,
        skip_special_tokens=body.skip_special_tokens,
        include_stop_str_in_output=body.include_stop_str_in_output,
    )


def stop_strings(stop: Any) -> tuple[str, ...]:
    """``stop`` as a tuple of strings (one string, a list, or none)."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise SamplingParamsError(
            "stop must be a non-empty string or a list of non-empty strings", param="stop"
        )
    return tuple(stop)
