"""How ``LLM.generate`` turns a batch of prompts into engine requests and back.

Prompts come as text, ``{"prompt": text}`` or ``{"prompt_token_ids": ids}`` (vLLM's
``TextPrompt``/``TokensPrompt``). A prompt whose ``SamplingParams`` ask for ``n`` sequences
becomes ``n`` engine requests with ``n=1``; sequence ``i`` of a seeded prompt samples with
``(seed + i) % 2**64`` (vLLM's rule), so sequence 0 is what the same prompt gives with ``n=1``.
The finished sequences are gathered back into one :class:`RequestOutput` per prompt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.errors import InvalidRequestError
from core.sampling import SamplingParams, sequence_seed
from engine.outputs import RequestOutput

PromptInput = str | Mapping[str, Any]
"""One prompt: text, ``{"prompt": text}`` or ``{"prompt_token_ids": [ids]}``; a dict may add
``"cache_salt": str`` (vLLM's field: cached blocks are shared only within one salt)."""


@dataclass(frozen=True)
class SequenceRequest:
    """One engine request: sequence ``index`` of a prompt."""

    request_id: str
    index: int
    params: SamplingParams


@dataclass(frozen=True)
class PromptJob:
    """One prompt of the batch and the engine requests that generate its sequences."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sequences: tuple[SequenceRequest, ...]
    cache_salt: str | None = None


def plan_prompt(
    request_id: str,
    prompt: str | None,
    prompt_token_ids: list[int],
    params: SamplingParams,
    cache_salt: str | None = None,
) -> PromptJob:
    """The job for one prompt: one engine request (id ``request_id``) when ``n == 1``, else
    ``request_id-0`` .. ``request_id-{n-1}`` with derived seeds."""
    if params.n == 1:
        sequences: tuple[SequenceRequest, ...] = (SequenceRequest(request_id, 0, params),)
    else:
        sequences = tuple(
            SequenceRequest(
                f"{request_id}-{i}",
                i,
                dataclasses.replace(params, n=1, seed=sequence_seed(params.seed, i)),
            )
            for i in range(params.n)
        )
    return PromptJob(request_id, prompt, prompt_token_ids, sequences, cache_salt)


def gather(job: PromptJob, finals: Mapping[str, RequestOutput]) -> RequestOutput:
    """One finished output for ``job`` with its sequences as ``outputs[0..n-1]``."""
    firsts = [finals[seq.request_id] for seq in job.sequences]
    if len(firsts) == 1:
        return firsts[0]
    return RequestOutput(
        request_id=job.request_id,
        prompt=job.prompt,
        prompt_token_ids=tuple(job.prompt_token_ids),
        outputs=[
            dataclasses.replace(out.outputs[0], index=seq.index)
            for seq, out in zip(job.sequences, firsts, strict=True)
        ],
        finished=True,
        num_cached_tokens=firsts[0].num_cached_tokens,
    )


def parse_prompts(
    prompts: PromptInput | Sequence[PromptInput] | None,
    prompt_token_ids: Sequence[Sequence[int]] | None,
    encode: Callable[[str], list[int]],
) -> tuple[list[str | None], list[list[int]]]:
    """Texts (None where given as ids) and token ids of every prompt, in order."""
    if (prompts is None) == (prompt_token_ids is None):
        raise InvalidRequestError(
            "pass exactly one of prompts or prompt_token_ids", param="prompts"
        )
    if prompt_token_ids is not None:
        return [None] * len(prompt_token_ids), [list(ids) for ids in prompt_token_ids]
    items = [prompts] if isinstance(prompts, str | Mapping) else list(prompts or [])
    texts: list[str | None] = []
    token_lists: list[list[int]] = []
    for item in items:
        text, ids = _one_prompt(item, encode)
        texts.append(text)
        token_lists.append(ids)
    return texts, token_lists


def _one_prompt(item: object, encode: Callable[[str], list[int]]) -> tuple[str | None, list[int]]:
    if isinstance(item, str):
        return item, encode(item)
    if isinstance(item, Mapping) and "prompt_token_ids" in item:
        return item.get("prompt"), list(item["prompt_token_ids"])
    if isinstance(item, Mapping) and isinstance(item.get("prompt"), str):
        return item["prompt"], encode(item["prompt"])
    raise InvalidRequestError(
        "each prompt must be a string, {'prompt': str} or {'prompt_token_ids': [int, ...]}, "
        f"got {item!r}",
        param="prompts",
    )


def prompt_salts(
    prompts: PromptInput | Sequence[PromptInput] | None, count: int
) -> list[str | None]:
    """Each prompt's ``cache_salt`` (``None`` where it has none)."""
    if prompts is None:
        return [None] * count
    items = [prompts] if isinstance(prompts, str | Mapping) else list(prompts)
    salts: list[str | None] = []
    for item in items:
        salt = item.get("cache_salt") if isinstance(item, Mapping) else None
        if salt is not None and (not isinstance(salt, str) or not salt):
            raise InvalidRequestError(
                f"cache_salt must be a non-empty string, got {salt!r}", param="cache_salt"
            )
        salts.append(salt)
    return salts


def params_list(
    sampling_params: SamplingParams | Sequence[SamplingParams] | None, count: int
) -> list[SamplingParams]:
    """One ``SamplingParams`` per prompt: the default, one shared, or one each."""
    if sampling_params is None:
        return [SamplingParams()] * count
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * count
    if len(sampling_params) != count:
        raise InvalidRequestError(
            f"got {len(sampling_params)} sampling_params for {count} prompts",
            param="sampling_params",
        )
    return list(sampling_params)
