"""One :class:`~engine.engine.LLMEngine` on a dedicated thread, served to asyncio code.

``LLMEngine`` is not thread-safe, so exactly one thread (``pdserve-engine``) touches it. That
thread loops: run every queued command (add, abort, release, an arbitrary ``call``), ``step()``
while some request can progress, and block on the command queue when none can — including while
requests only wait for imported KV — so an idle engine costs no CPU. Each request's outputs go
to an asyncio queue on the caller's loop via ``loop.call_soon_threadsafe``; the event loop never
blocks on the engine. A :class:`StepDriver` (e.g. an expert-parallel rank's lockstep driver)
may replace ``engine.step()`` and the pacing: the thread then steps through it and waits for
commands only as long as it says.

Admission is all or nothing: an ``open`` that raises (whatever the type) leaves nothing queued
and no sink behind. A failing ``step()`` does not kill the thread: the engine has already
aborted the failed step's requests, and every request that could have been in the batch ends
with a typed ``PdserveError`` and its blocks are freed; the engine keeps serving. Requests
waiting for imported KV are left alone (a pull may still be writing into their blocks).
:meth:`AsyncEngine.shutdown` aborts everything, makes every waiter raise ``UnavailableError``
and joins the thread.
KV leaves and arrives through the KV connectors attached to the engine
(:meth:`AsyncEngine.attach_connector`; a role worker attaches its transport's): the thread
starts their transfers before each step and settles what they report ended after it
(:mod:`engine.kv_connector.attached`); a connector wakes the thread when a transfer ends while
it waits for commands. A request exported through one (``open(export_to=...)``) reports its
blocks as they complete; an import through one (:meth:`AsyncEngine.import_through`) is reserved,
handed to the connector and settled on the thread, its end told to the caller. The stream a
caller iterates is :mod:`engine.request_stream`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from core.errors import PdserveError, UnavailableError
from core.kv_layout import KVLayout
from core.sampling import SamplingParams
from core.stats import LoRAAdapterStats, ReplicaStats
from engine.engine import LLMEngine
from engine.kv_connector.attached import AttachedConnectors
from engine.kv_connector.base import ImportEnded, KVConnector, KVImportSource
from engine.kv_connector.export_progress import ConnectorWatcher, ExportProgress
from engine.lora import LoRARequest
from engine.outputs import RequestOutput
from engine.request import RequestStatus
from engine.request_stream import ABORTED, RequestStream, Sink, StreamItem
from engine.scheduler.output import ImportAllocation, SchedulerStats

logger = logging.getLogger(__name__)

T = TypeVar("T")
_STALLED_RECHECK_S = 1.0  # safety net: re-plan after this long even if no command arrived


@dataclass(frozen=True)
class ConnectedImport:
    """An import handed to a connector: its blocks, its stream, and how its copy ended."""

    allocation: ImportAllocation
    stream: RequestStream
    ended: Future[ImportEnded | None]
    """Resolves once the connector's copy ended and the engine settled it (the request joined
    the batch, recomputes or failed); None when the request was aborted first."""


@dataclass
class _Command:
    run: Callable[[], Any]
    future: Future[Any] | None = None
    stop: bool = False


class StepDriver(Protocol):
    """Replaces the engine thread's own pacing: the thread steps through the driver whenever
    it is not running commands (e.g. one rank of an expert-parallel gang, which must keep
    stepping in lockstep with its peers even when it has no work of its own)."""

    def wait_s(self) -> float | None:
        """How long the thread may wait for a command before the next step (0: step at once,
        None: until a command arrives)."""
        ...

    def step(self) -> list[RequestOutput]:
        """One step of the engine; its request outputs."""
        ...

    @property
    def usable(self) -> bool:
        """False once stepping can never succeed again: the thread fails everything and stops."""
        ...

    def close(self) -> None:
        """Release what the driver holds (called once, on the engine thread, as it stops)."""
        ...


class AsyncEngine:
    """Runs one :class:`LLMEngine` on a dedicated thread; every method is safe from any thread
    and none blocks the event loop (except :meth:`shutdown`, which joins the thread).

    ``driver``: step through it instead of ``engine.step()``, paced by it (see
    :class:`StepDriver`); ``connector``: a KV connector attached from the start (see
    :meth:`attach_connector`)."""

    def __init__(
        self,
        engine: LLMEngine,
        *,
        driver: StepDriver | None = None,
        connector: KVConnector | None = None,
    ) -> None:
        self.engine = engine
        self._driver = driver
        """The wrapped engine: touch it only through :meth:`call` (its ``parts`` are immutable)."""
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}  # engine thread only
        self._live: set[str] = set()  # engine thread only: ids that may hold engine state
        self._prune_at = 1024
        self._stalled = False
        self._stats = engine.scheduler.stats()  # replaced whole, never mutated: safe to read
        self._prefill_totals = (0, 0.0)  # (tokens, seconds) of prompt compute, replaced whole
        self._lora_stats: tuple[LoRAAdapterStats, ...] = ()  # replaced whole
        self._exports = ExportProgress(engine)  # engine thread only
        self._connectors = AttachedConnectors(engine, self._wake)  # engine thread only
        self._lock = threading.Lock()
        self._closed = False
        self._wake_queued = False  # guarded by _lock
        if connector is not None:
            self._connectors.attach(connector)
        self._stop_reason = "the engine is shut down"
        self._thread = threading.Thread(target=self._run, name="pdserve-engine", daemon=True)
        self._thread.start()

    # -- asyncio API --------------------------------------------------------------------------

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        prefill_only: bool = False,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Add a request and yield its outputs; closing the iterator early aborts it."""
        stream = await self.open(
            request_id,
            prompt_token_ids,
            params,
            prefill_only=prefill_only,
            cache_salt=cache_salt,
            lora_request=lora_request,
        )
        try:
            async for output in stream:
                yield output
        finally:
            stream.close()

    async def open(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        prefill_only: bool = False,
        cache_salt: str | None = None,
        export_to: KVConnector | None = None,
        lora_request: LoRARequest | None = None,
    ) -> RequestStream:
        """Add a request; raises its admission error (``PromptTooLongError``, ...). A
        prefill-only request with ``export_to`` (an attached connector) hands its KV to it as
        it completes (:mod:`engine.kv_connector.export_progress`). ``lora_request``: run
        under that adapter (a bad one raises its ``LoRAAdapterError``)."""

        def add(engine: LLMEngine) -> None:
            if export_to is not None:
                self._connectors.check(export_to)
            engine.add_request(
                request_id,
                prompt_token_ids,
                params,
                prefill_only=prefill_only,
                cache_salt=cache_salt,
                lora_request=lora_request,
            )
            if export_to is not None:
                self._exports.watch(request_id, ConnectorWatcher(export_to, request_id))

        stream, _ = await self._open(request_id, prompt_token_ids, add)
        return stream

    async def open_import(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        first_token_id: int | None,
        prompt_chunk_ends: tuple[int, ...] = (),
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> tuple[ImportAllocation, RequestStream]:
        """``add_import_request`` on the engine thread plus the stream of its outputs (the
        tokens after ``first_token_id``, once ``mark_kv_ready`` or ``mark_kv_failed`` ran).
        Nothing writes its blocks: a reservation only (tests, pool pressure); a role imports
        through :meth:`import_through`."""

        def add(engine: LLMEngine) -> ImportAllocation:
            return engine.add_import_request(
                request_id,
                prompt_token_ids,
                params,
                first_token_id,
                prompt_chunk_ends,
                cache_salt=cache_salt,
                lora_request=lora_request,
            )

        stream, allocation = await self._open(request_id, prompt_token_ids, add)
        return allocation, stream

    async def import_through(
        self,
        connector: KVConnector,
        source: KVImportSource,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        first_token_id: int | None,
        prompt_chunk_ends: tuple[int, ...] = (),
        *,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
        recompute_on_failure: bool = True,
    ) -> ConnectedImport:
        """Reserve blocks for the prompt and hand the missing ones to ``connector`` (attached)
        to write from ``source``; the engine settles the copy's end. ``first_token_id`` None: a
        pipelined import, whose first token comes with its KV. A failed copy recomputes the
        prompt here when the first token is known and ``recompute_on_failure``; else the
        request ends (its caller reports ``ended``'s failure). Raises admission errors and the
        connector's refusal (``LayoutMismatchError``), leaving nothing behind."""
        ended: Future[ImportEnded | None] = Future()

        def add(engine: LLMEngine) -> ImportAllocation:
            self._connectors.check(connector)
            allocation = engine.add_import_request(
                request_id,
                prompt_token_ids,
                params,
                first_token_id,
                prompt_chunk_ends,
                cache_salt=cache_salt,
                lora_request=lora_request,
            )
            try:
                connector.import_blocks(allocation, source)
            except BaseException:
                engine.abort(request_id)
                raise
            self._connectors.add_import(request_id, ended, recompute_on_failure)
            return allocation

        stream, allocation = await self._open(request_id, prompt_token_ids, add)
        return ConnectedImport(allocation, stream, ended)

    async def _open(
        self, request_id: str, prompt_token_ids: list[int], add: Callable[[LLMEngine], T]
    ) -> tuple[RequestStream, T]:
        sink = Sink(asyncio.get_running_loop(), asyncio.Queue())

        def run() -> T:
            result = add(self.engine)  # NOTE: admits the request whole or raises leaving none
            try:
                self._sinks[request_id] = sink
                self._track(request_id)
            except BaseException:
                if self._sinks.get(request_id) is sink:
                    del self._sinks[request_id]
                self.engine.abort(request_id)
                raise
            return result

        future = self._submit(run, with_future=True)
        try:
            result = await asyncio.wrap_future(future)
        except asyncio.CancelledError:  # undo the add if it ran (or still runs) after all

            def undo(done: Future[T]) -> None:
                if not done.cancelled() and done.exception() is None:
                    self.abort_soon(request_id)

            future.add_done_callback(undo)
            raise
        return RequestStream(request_id, prompt_token_ids, sink, self.abort_soon), result

    async def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """Run ``fn(engine)`` on the engine thread between steps and return its result (tests
        and this class; the roles use the named methods below)."""
        return await asyncio.wrap_future(self.submit(fn))

    def submit(self, fn: Callable[[LLMEngine], T]) -> Future[T]:
        """Queue ``fn(engine)`` for the engine thread; a future of its result (any thread)."""
        return self._submit(lambda: fn(self.engine), with_future=True)

    async def abort(self, request_id: str) -> bool:
        """Abort a request now and free its blocks; False when it is unknown or done."""
        return await asyncio.wrap_future(
            self._submit(lambda: self._abort_now(request_id), with_future=True)
        )

    def abort_soon(self, request_id: str) -> None:
        """Abort a request on the engine thread without waiting (any thread, idempotent)."""
        self._submit_quietly(lambda: self._abort_now(request_id))

    # -- the KV hand-off ------------------------------------------------------------------------

    @property
    def layout(self) -> KVLayout:
        """The KV layout of this engine's cache (its fingerprint travels on every handle)."""
        return self.engine.parts.layout

    def attach_connector(self, connector: KVConnector) -> None:
        """Drive ``connector`` from now on: its ``before_free`` joins the KV manager's
        listeners, its transfers start before each step and what it reports ended is settled
        after it (and whenever it wakes the thread). Any thread but the engine's; returns once
        attached."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("attach_connector from the engine thread would wait for itself")
        self._submit(lambda: self._connectors.attach(connector), with_future=True).result()

    def stats(self) -> SchedulerStats:
        """The scheduler's stats after the latest step or command (thread-safe snapshot)."""
        return self._stats

    def kv_stats(self) -> ReplicaStats:
        """The engine half of a role replica's stats: KV blocks and queue lengths
        (``num_waiting`` includes the requests waiting for imported KV)."""
        s = self._stats
        return ReplicaStats(
            kv_blocks_total=s.num_free_blocks + s.num_used_blocks,
            kv_blocks_used=s.num_used_blocks,
            kv_blocks_free=s.num_free_blocks,
            num_running=s.num_running,
            num_waiting=s.num_waiting + s.num_waiting_for_kv,
            num_waiting_for_kv=s.num_waiting_for_kv,
            num_pinned=s.num_pinned,
            kv_tiers=s.kv_tiers,
            kv_block_size=self.engine.scheduler.block_size,
            pending_prompt_tokens=s.num_pending_prompt_tokens,
            prefill_tokens_total=self._prefill_totals[0],
            prefill_seconds_total=self._prefill_totals[1],
            spec_decode=s.spec_decode,
            kv_block_bytes=self.engine.parts.layout.block_bytes,
            lora_adapters=self._lora_stats,
            max_loras=0 if self.engine.parts.lora is None else self.engine.parts.lora.max_loras,
        )

    @property
    def driver(self) -> StepDriver | None:
        """The step driver given at construction, if any."""
        return self._driver

    def is_running(self) -> bool:
        """False once :meth:`shutdown` ran or the engine thread died (for health checks)."""
        return self._thread.is_alive() and not self._closed

    def shutdown(self) -> None:
        """Abort every request (waiters raise ``UnavailableError``) and join the thread."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._commands.put(_Command(lambda: None, stop=True))
        if threading.current_thread() is not self._thread:
            self._thread.join()

    # -- submission ---------------------------------------------------------------------------

    def _submit(self, run: Callable[[], T], *, with_future: bool) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise UnavailableError("the engine is shut down")
            self._commands.put(_Command(run, future if with_future else None))
        return future

    def _submit_quietly(self, run: Callable[[], object]) -> None:
        try:
            self._submit(run, with_future=False)
        except UnavailableError:
            logger.debug("engine is shut down; dropping a fire-and-forget command")

    # -- the engine thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._run_commands(self._wait_s()):
                self._connectors.start_transfers()
                if (self._driver is not None or self._can_step()) and not self._step():
                    break
                self._settle()
        except BaseException:
            logger.exception("engine thread crashed")
            raise
        finally:
            self._close_all()

    # -- connectors (engine thread) -------------------------------------------------------------

    def _wake(self) -> None:
        """Any thread: a connector has something to settle; wake the thread (once queued)."""
        with self._lock:
            if self._closed or self._wake_queued:
                return
            self._wake_queued = True
            self._commands.put(_Command(self._woken))

    def _woken(self) -> None:
        with self._lock:
            self._wake_queued = False  # NOTE: before settling, so a later end wakes again

    def _settle(self) -> None:
        outputs = self._connectors.settle()
        if outputs is None:
            return
        self._stalled = False  # an import may have joined the waiting queue
        self._refresh_stats()
        for output in outputs:
            self._deliver(output)

    def _can_step(self) -> bool:
        stats = self.engine.scheduler.stats()
        return (
            not self._stalled and stats.num_running + stats.num_waiting + stats.num_loading_kv > 0
        )

    def _wait_s(self) -> float | None:
        """How long to wait for a command before stepping (0: not at all, None: forever)."""
        if self._driver is not None:
            return self._driver.wait_s()
        if self._can_step():
            return 0.0
        return _STALLED_RECHECK_S if self._stalled else None

    def _run_commands(self, wait_s: float | None) -> bool:
        """Run queued commands (waiting up to ``wait_s`` for one); False once told to stop."""
        try:
            if wait_s == 0.0:
                command = self._commands.get_nowait()
            else:
                command = self._commands.get(timeout=wait_s)
        except queue.Empty:
            self._stalled = False  # (stalled only) re-plan once as a safety net
            return True
        while True:
            if command.stop:
                return False
            self._stalled = False
            self._execute(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _execute(self, command: _Command) -> None:
        future = command.future
        if future is not None and not future.set_running_or_notify_cancel():
            return  # the caller gave up before it ran
        try:
            result = command.run()
        except BaseException as e:
            self._refresh_stats()
            if future is None:
                logger.exception("engine command failed")
            else:
                future.set_exception(e)
            return
        self._refresh_stats()  # NOTE: before the caller wakes, so it sees the command's effect
        if future is not None:
            future.set_result(result)

    def _refresh_stats(self) -> None:
        self._stats = self.engine.scheduler.stats()
        rate = self.engine.prefill_rate
        self._prefill_totals = (rate.tokens_total, rate.seconds_total)
        if self.engine.parts.lora is not None:
            self._lora_stats = self.engine.parts.lora.adapter_stats()

    def _step(self) -> bool:
        """One step and its outputs; False when the driver can never step again."""
        preemptions_before = self._stats.num_preemptions_total
        try:
            outputs = self.engine.step() if self._driver is None else self._driver.step()
        except Exception as e:
            if not self.engine.usable or (self._driver is not None and not self._driver.usable):
                logger.error("engine step failed for good (%r); stopping the engine", e)
                self._stop_reason = f"the engine stopped: {e}"
                return False
            self._fail_batch(e)
            return True
        self._exports.report()  # NOTE: before the outputs: a finished export completes first
        self._refresh_stats()
        for output in outputs:
            self._deliver(output)
        stats = self._stats
        # NOTE: nothing running and nothing produced means the plan was empty (waiting requests
        # do not fit); only a command (release, abort, ...) can change that, so wait for one.
        self._stalled = (
            not outputs
            and stats.num_running == 0
            and stats.num_preemptions_total == preemptions_before
        )
        return True

    def _deliver(self, output: RequestOutput) -> None:
        """Hand ``output`` to its request's stream (the last one when finished); engine thread."""
        sink = self._sinks.get(output.request_id)
        if sink is None:
            return
        if output.finished:
            del self._sinks[output.request_id]
        if output.error is not None:  # it failed alone: its stream raises, the others go on
            self._push(output.request_id, sink, PdserveError(output.error))
            return
        self._push(output.request_id, sink, output)

    def _push(self, request_id: str, sink: Sink, item: StreamItem) -> None:
        try:
            sink.loop.call_soon_threadsafe(sink.queue.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed: nobody will read this request
            logger.warning("request %s: its event loop is closed; aborting it", request_id)
            self._sinks.pop(request_id, None)
            self.engine.abort(request_id)
            self._connectors.end_import(request_id, None)

    def _abort_now(self, request_id: str) -> bool:
        found = self.engine.abort(request_id)
        self._connectors.end_import(request_id, None)
        self._refresh_stats()
        sink = self._sinks.pop(request_id, None)
        if sink is not None:
            self._push(request_id, sink, ABORTED)
        if found:
            logger.info("request %s aborted", request_id)
        return found

    def _track(self, request_id: str) -> None:
        self._live.add(request_id)
        if len(self._live) > self._prune_at:
            get = self.engine.scheduler.get_request
            self._live = {rid for rid in self._live if get(rid) is not None}
            self._prune_at = max(1024, 2 * len(self._live))

    def _fail_batch(self, error: Exception) -> None:
        scheduler = self.engine.scheduler
        failed = {}
        for request_id in list(self._sinks):
            request = scheduler.get_request(request_id)
            if request is not None and request.status is RequestStatus.WAITING_FOR_KV:
                continue  # not in the batch; a pull may still write its blocks
            failed[request_id] = self._sinks.pop(request_id)
            try:
                self.engine.abort(request_id)
            except Exception:
                logger.exception("request %s: abort after a failed step raised", request_id)
        logger.error("engine step failed (%r); failing requests %s", error, list(failed))
        self._refresh_stats()
        for request_id, sink in failed.items():
            self._push(
                request_id,
                sink,
                PdserveError(
                    f"engine step failed for the whole batch, not for one request: {error!r}"
                ),
            )

    def _close_all(self) -> None:
        with self._lock:
            self._closed = True
        for request_id in self._live:
            try:
                self.engine.abort(request_id)
            except Exception:
                logger.exception("request %s: abort at shutdown raised", request_id)
        self._connectors.close(self._stop_reason)
        for request_id, sink in self._sinks.items():
            self._push(request_id, sink, UnavailableError(self._stop_reason))
        self._sinks.clear()
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if command.future is not None and command.future.set_running_or_notify_cancel():
                command.future.set_exception(UnavailableError("the engine is shut down"))
        self._refresh_stats()
        if self._driver is not None:
            try:
                self._driver.close()
            except Exception:
                logger.exception("closing the step driver raised")
        self.engine.close()
        logger.info("engine thread stopped")
