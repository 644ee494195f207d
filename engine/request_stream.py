"""The stream of one request's outputs, as the asyncio caller of an engine thread reads it.

The engine thread (:mod:`engine.async_engine`) pushes each output, an error, or :data:`ABORTED`
into the request's :class:`Sink` through ``loop.call_soon_threadsafe``; the caller iterates the
:class:`RequestStream` on its own loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from engine.outputs import CompletionOutput, RequestOutput

ABORTED = "aborted"  # queue marker: the request was aborted from elsewhere

StreamItem = RequestOutput | BaseException | str  # an output, an error to raise, or ABORTED


@dataclass
class Sink:
    """Where one request's items go: a queue on the caller's event loop."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[StreamItem]


class RequestStream:
    """The outputs of one request, one per engine step that advanced it.

    Iterate with ``async for``; it ends after the finished output. An abort from elsewhere ends
    it with a finished output whose ``finish_reason`` is ``"abort"``. :meth:`close` aborts the
    request (freeing its blocks) unless it already finished.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sink: Sink,
        on_close: Callable[[str], None],
    ) -> None:
        self.request_id = request_id
        self._prompt_token_ids = tuple(prompt_token_ids)
        self._sink = sink
        self._on_close = on_close
        self._last: RequestOutput | None = None
        self._done = False

    @property
    def finished(self) -> bool:
        """True once the final output was returned, an error raised, or the stream closed."""
        return self._done

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        item = await self._sink.queue.get()
        if isinstance(item, BaseException):
            self._done = True
            raise item
        if isinstance(item, str):  # ABORTED
            self._done = True
            return self._aborted_output()
        self._last = item
        self._done = item.finished
        return item

    def _aborted_output(self) -> RequestOutput:
        last = self._last
        empty = CompletionOutput(index=0, text="", token_ids=())
        so_far = empty if last is None else last.outputs[0]
        return RequestOutput(
            request_id=self.request_id,
            prompt=None if last is None else last.prompt,
            prompt_token_ids=self._prompt_token_ids,
            outputs=[dataclasses.replace(so_far, finish_reason="abort", stop_reason=None)],
            finished=True,
            num_cached_tokens=0 if last is None else last.num_cached_tokens,
        )

    def close(self) -> None:
        """Abort the request unless it already finished; idempotent, callable from any thread."""
        if not self._done:
            self._done = True
            self._on_close(self.request_id)
