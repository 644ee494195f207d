"""The requests a run sends the pools, built from its prepared prompt."""

from __future__ import annotations

from cluster.ingress.dispatch.prepared_prompt import PreparedPrompt
from core.messages import DecodeRequest, PrefillRequest, PrefillResult


def prefill_request(request_id: str, prompt: PreparedPrompt) -> PrefillRequest:
    """The remote prefill of ``prompt``."""
    return PrefillRequest(
        request_id, list(prompt.prompt_token_ids), prompt.sampling, prompt.routing
    )


def decode_request(
    request_id: str, prompt: PreparedPrompt, result: PrefillResult | None
) -> DecodeRequest:
    """The decode of ``prompt``: after the remote prefill ``result`` (its first token and KV
    handle), or with ``None`` a local prefill on the decode replica."""
    return DecodeRequest(
        request_id=request_id,
        prompt_token_ids=list(prompt.prompt_token_ids),
        sampling=prompt.sampling,
        routing=prompt.routing,
        first_token_id=None if result is None else result.first_token_id,
        kv_handle=None if result is None else result.kv_handle,
        prompt_chunk_ends=() if result is None else result.prompt_chunk_ends,
    )
