"""Small helpers shared by the P/D hand-off tests: waiting on conditions and running one handoff."""

from __future__ import annotations

from dataclasses import dataclass

from core.messages import (
    DecodeRequest,
    PrefillRequest,
    PrefillResult,
    TokenChunk,
)
from core.sampling import SamplingParams
from decode.worker import DecodeWorker
from prefill.worker import PrefillWorker


@dataclass
class Handoff:
    """What one prefill -> decode request produced."""

    prefill: PrefillResult
    chunks: list[TokenChunk]

    @property
    def token_ids(self) -> list[int]:
        """The first token plus every decoded one."""
        return [self.prefill.first_token_id] + [t for c in self.chunks for t in c.token_ids]

    @property
    def text(self) -> str:
        """The first token's text plus every chunk's."""
        return self.prefill.first_text + "".join(c.text for c in self.chunks)


async def prefill(
    worker: PrefillWorker, request_id: str, prompt: list[int], params: SamplingParams
) -> PrefillResult:
    """Run one prefill request."""
    return await worker.prefill(PrefillRequest(request_id, prompt, params))


def decode_request(
    request_id: str, prompt: list[int], params: SamplingParams, result: PrefillResult | None
) -> DecodeRequest:
    """The decode request that continues ``result`` (local prefill when None)."""
    return DecodeRequest(
        request_id,
        prompt,
        params,
        first_token_id=None if result is None else result.first_token_id,
        kv_handle=None if result is None else result.kv_handle,
        prompt_chunk_ends=() if result is None else result.prompt_chunk_ends,
    )


async def collect(worker: DecodeWorker, request: DecodeRequest) -> list[TokenChunk]:
    """Every chunk of one decode stream."""
    return [chunk async for chunk in worker.generate(request)]


async def handoff(
    prefill_worker: PrefillWorker,
    decode_worker: DecodeWorker,
    request_id: str,
    prompt: list[int],
    params: SamplingParams,
) -> Handoff:
    """Prefill on one worker, decode on the other with the returned handle."""
    result = await prefill(prefill_worker, request_id, prompt, params)
    chunks = await collect(decode_worker, decode_request(request_id, prompt, params, result))
    return Handoff(result, chunks)
