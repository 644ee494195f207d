"""A request's remote prefill, one-shot or pipelined; ``None`` means prefill locally instead.

One-shot: the prefill pool computes the prompt and returns the first token plus a KV handle.
Pipelined (prompts of ``pipelined_from_tokens`` and more): the prefill answers at once with an
export the decode can pull from while the prompt is computed, so the decode call starts right
away (an :class:`~cluster.ingress.dispatch.open_decode.OpenDecode`) and the transfer hides
behind the rest of the prefill. A failure goes to the model's
:class:`~cluster.ingress.dispatch.prefill_failover.PrefillFailover`, which re-raises it or
lets the request fall back.
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from dataclasses import dataclass

from cluster.ingress.dispatch.open_decode import OpenDecode, close_opened
from cluster.ingress.dispatch.pool_clients import DecodeClient, PrefillClient
from cluster.ingress.dispatch.pool_requests import (
    pipelined_decode_request,
    prefill_request,
)
from cluster.ingress.dispatch.prefill_failover import PrefillFailover
from cluster.ingress.dispatch.prepared_prompt import PreparedPrompt
from cluster.ingress.settings import IngressSettings
from core.errors import UnavailableError
from core.messages import PrefillResult, PrefillStarted


@dataclass(frozen=True)
class Prefilled:
    """A remote prefill's result, and the decode call already started on its export (pipelined
    hand-off with tokens still to decode)."""

    result: PrefillResult
    opened: OpenDecode | None


class RemotePrefill:
    """Runs one request's remote prefill against a model's prefill pool."""

    def __init__(
        self,
        prefill: PrefillClient,
        decode: DecodeClient,
        failover: PrefillFailover,
        settings: IngressSettings,
    ) -> None:
        self._prefill = prefill
        self._decode = decode
        self._failover = failover
        self._settings = settings

    async def run(self, request_id: str, prompt: PreparedPrompt) -> Prefilled | None:
        """The prefill (pipelined for long prompts), or None to fall back to local prefill."""
        threshold = self._settings.pipelined_from_tokens
        if threshold is not None and prompt.num_prompt_tokens >= threshold:
            return await self._pipelined(request_id, prompt)
        return await self._one_shot(request_id, prompt)

    async def _one_shot(self, request_id: str, prompt: PreparedPrompt) -> Prefilled | None:
        try:
            async with asyncio.timeout(self._settings.server.prefill_timeout_s):
                result = await self._prefill.prefill(prefill_request(request_id, prompt))
            self._failover.succeeded()
            return Prefilled(result, None)
        except Exception as e:
            self._failover.handle(request_id, e)
            return None

    async def _pipelined(self, request_id: str, prompt: PreparedPrompt) -> Prefilled | None:
        """The decode call starts on the prefill's first answer (its open export), then the
        prefill result arrives; on a fallback the decode call, if started, is closed."""
        opened: OpenDecode | None = None
        try:
            async with asyncio.timeout(self._settings.server.prefill_timeout_s):
                updates = self._prefill.prefill_stream(prefill_request(request_id, prompt))
                async with aclosing(updates):  # type: ignore[type-var]
                    async for update in updates:
                        if isinstance(update, PrefillStarted):
                            request = pipelined_decode_request(request_id, prompt, update.kv_handle)
                            opened = OpenDecode.start(self._decode, request)
                            continue
                        self._failover.succeeded()
                        if update.finish_reason is not None or update.kv_handle is None:
                            await close_opened(opened)  # nothing to decode after all
                            opened = None
                        return Prefilled(update, opened)
            raise UnavailableError(f"request {request_id}: the prefill stream ended early")
        except BaseException as e:
            await close_opened(opened)
            if not isinstance(e, Exception):
                raise
            self._failover.handle(request_id, e)
            return None
