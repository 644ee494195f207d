"""A request's decode that survives its replica: a stream that dies mid-way continues on
another replica, up to ``routing.migration_limit`` times (how the request and its text are
rebuilt: :mod:`cluster.ingress.dispatch.migration`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing

from cluster.ingress.dispatch.decode_stream import DecodeStream
from cluster.ingress.dispatch.deltas import Delta
from cluster.ingress.dispatch.migration import (
    DetokenizerFactory,
    HandedOffError,
    ResumedText,
    can_migrate,
    migrated_request,
)
from cluster.ingress.dispatch.open_decode import OpenDecode
from cluster.ingress.dispatch.pool_requests import decode_request
from cluster.ingress.dispatch.prepared_prompt import PreparedPrompt
from cluster.ingress.dispatch.run_accounting import RunAccounting
from cluster.ingress.settings import IngressSettings
from core.errors import PdserveError
from core.messages import DecodeRequest

logger = logging.getLogger(__name__)

_MIGRATION_BACKOFF_S = 0.2
"""Pause before the first migration attempt; doubled for each further one (capped at 2 s)."""


class MigratingDecode:
    """The decode of one request, migrated when its stream fails."""

    def __init__(
        self,
        stream: DecodeStream,
        accounting: RunAccounting,
        request_id: str,
        prompt: PreparedPrompt,
        settings: IngressSettings,
        detokenizer: DetokenizerFactory | None,
    ) -> None:
        self._stream = stream
        self._accounting = accounting
        self._request_id = request_id
        self._prompt = prompt
        self._settings = settings
        self._detokenizer = detokenizer  # renders a migrated request's text

    async def deltas(
        self, request: DecodeRequest, opened: OpenDecode | None = None
    ) -> AsyncGenerator[Delta, None]:
        """The decode pool's deltas (the first attempt on ``opened`` when the call already
        started)."""
        accounting = self._accounting
        resumed: ResumedText | None = None
        attempt = 0
        while True:
            try:
                async with aclosing(self._stream.deltas(request, opened, resumed)) as deltas:
                    async for delta in deltas:
                        yield delta
                return
            except (PdserveError, TimeoutError) as e:
                limit = self._settings.routing.migration_limit
                if attempt >= limit or not can_migrate(e) or accounting.finish_reason is not None:
                    raise
                attempt += 1
                handed_off = isinstance(e, HandedOffError)
                accounting.count_migration(
                    "timeout"
                    if isinstance(e, TimeoutError)
                    else "handed_off"
                    if handed_off
                    else "replica_failed"
                )
                logger.warning(
                    "request %s: decode stream failed after %d tokens (%s); migrating (%d/%d)",
                    self._request_id, len(accounting.sent_token_ids), e, attempt, limit,
                )  # fmt: skip
                opened = None
                request = migrated_request(
                    decode_request(self._request_id, self._prompt, None),
                    list(accounting.sent_token_ids),
                    attempt,
                    block_size=self._settings.block_size,
                    hash_seed=self._settings.hash_seed,
                    warm_from=e.export if isinstance(e, HandedOffError) else None,
                )
                if self._detokenizer is not None:
                    prompt_ids = list(self._prompt.prompt_token_ids)
                    resumed = ResumedText(
                        self._detokenizer(prompt_ids),
                        accounting.sent_token_ids,
                        accounting.text_sent,
                    )
                if not handed_off:  # let Serve drop the dead replica from its routing first
                    await asyncio.sleep(min(_MIGRATION_BACKOFF_S * 2 ** (attempt - 1), 2.0))
