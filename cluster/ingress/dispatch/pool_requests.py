"""The requests a run sends the pools, built from its prepared prompt."""

from __future__ import annotations

from dataclasses import replace

from cluster.ingress.dispatch.pairing import handle_fingerprint
from cluster.ingress.dispatch.prepared_prompt import PreparedPrompt
from core.kv_handle import KVHandle
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
    handle), or with ``None`` a local prefill on the decode replica. Its routing keys name the
    fingerprint of the handle's exporter, so only a decode that can read the KV is chosen."""
    handle = None if result is None else result.kv_handle
    fingerprint = handle_fingerprint(handle, prompt.routing.kv_fingerprint)
    return DecodeRequest(
        request_id=request_id,
        prompt_token_ids=list(prompt.prompt_token_ids),
        sampling=prompt.sampling,
        routing=replace(prompt.routing, kv_fingerprint=fingerprint),
        first_token_id=None if result is None else result.first_token_id,
        kv_handle=None if result is None else result.kv_handle,
        prompt_chunk_ends=() if result is None else result.prompt_chunk_ends,
    )


def pipelined_decode_request(
    request_id: str, prompt: PreparedPrompt, handle: KVHandle
) -> DecodeRequest:
    """The decode of ``prompt`` pulling from a prefill still running (its open export
    ``handle``, no first token yet), routed to the handle's fingerprint."""
    request = decode_request(request_id, prompt, None)
    fingerprint = handle_fingerprint(handle, prompt.routing.kv_fingerprint)
    return replace(
        request, kv_handle=handle, routing=replace(request.routing, kv_fingerprint=fingerprint)
    )
