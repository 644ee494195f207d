"""The ``TokenChunk`` s a decode replica streams: a step's tokens, an abort, a typed error."""

from __future__ import annotations

from core.errors import ErrorReport, PdserveError
from core.messages import DecodeRequest, StageTimes, TokenChunk
from core.sampling import SamplingParams
from engine.outputs import RequestOutput, new_logprobs, prompt_message_logprobs


def token_chunk(
    output: RequestOutput,
    params: SamplingParams,
    num_prompt_tokens: int,
    num_cached_tokens: int,
    *,
    local: bool = False,
    stage_times: StageTimes | None = None,
) -> TokenChunk:
    """One step's chunk: its tokens (with logprobs when asked) and, on a local prefill's first
    chunk, the prompt's logprobs (an imported request's come from its prefill) and its engine
    queue and prefill times; ``stage_times`` overrides those (an import's)."""
    first = len(output.outputs[0].token_ids) == len(output.new_token_ids)
    prompt_logprobs = params.prompt_logprobs if local and first else None
    if stage_times is None and local and first and output.new_token_ids and output.metrics:
        stage_times = output.metrics.stage_times()
    return TokenChunk(
        request_id=output.request_id,
        token_ids=list(output.new_token_ids),
        text=output.new_text,
        finished=output.finished,
        finish_reason=output.finish_reason,
        num_prompt_tokens=num_prompt_tokens,
        num_cached_tokens=num_cached_tokens,
        logprobs=new_logprobs(output, params.logprobs),
        prompt_logprobs=prompt_message_logprobs(output, prompt_logprobs),
        stage_times=stage_times,
    )


def aborted_chunk(request: DecodeRequest) -> TokenChunk:
    return TokenChunk(request.request_id, [], "", True, "abort", len(request.prompt_token_ids), 0)


def error_chunk(request: DecodeRequest, error: PdserveError) -> TokenChunk:
    return TokenChunk(
        request_id=request.request_id,
        token_ids=[],
        text="",
        finished=True,
        finish_reason="error",
        num_prompt_tokens=len(request.prompt_token_ids),
        error=ErrorReport.of(error),
    )
