"""The :class:`~core.messages.PrefillResult` a prefill replica answers, built from the engine's
finished prefill-only output: the first token (with its logprobs when asked), the prompt's
logprobs, the KV handle and chunk ends, and the stage times (queue, prefill, export)."""

from __future__ import annotations

import dataclasses

from core.kv_handle import KVHandle
from core.messages import PrefillResult, StageTimes
from core.sampling import SamplingParams
from engine.outputs import RequestOutput, new_logprobs, prompt_message_logprobs


def prefill_result(
    first: RequestOutput,
    params: SamplingParams,
    handle: KVHandle | None,
    chunk_ends: tuple[int, ...] = (),
    export_s: float = 0.0,
) -> PrefillResult:
    """The answer for ``first`` (the finished prefill-only output); ``handle`` is None when the
    first token ended the request, ``export_s`` the time exporting its KV took."""
    first_logprobs = new_logprobs(first, params.logprobs)
    times = StageTimes() if first.metrics is None else first.metrics.stage_times()
    return PrefillResult(
        request_id=first.request_id,
        first_token_id=first.token_ids[0],
        first_text=first.text,
        num_cached_tokens=first.num_cached_tokens,
        kv_handle=handle,
        finish_reason=first.finish_reason,
        prompt_chunk_ends=chunk_ends,
        first_logprobs=first_logprobs[-1] if first_logprobs else None,
        prompt_logprobs=prompt_message_logprobs(first, params.prompt_logprobs),
        stage_times=dataclasses.replace(times, export_s=export_s),
    )
