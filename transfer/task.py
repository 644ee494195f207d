"""A handle on one running import: its state, progress, and how to wait for or cancel it.

A :class:`TransferTask` moves PENDING -> TRANSFERRING -> DONE | FAILED(reason) exactly once and
never leaves a terminal state. The decode engine polls :meth:`TransferTask.status` between steps,
registers a done callback, or awaits :meth:`TransferTask.as_future` from asyncio; nothing about it
blocks the caller unless it calls ``wait``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future

from core.errors import TransferError
from core.kv_handle import ExportDone, TransferFailure, TransferState, TransferStatus

logger = logging.getLogger(__name__)

DoneCallback = Callable[["TransferTask"], None]


class TransferTask:
    """Progress and outcome of one pull into destination blocks."""

    def __init__(self, transfer_id: str, dst_block_ids: tuple[int, ...], bytes_total: int) -> None:
        self.transfer_id = transfer_id
        self.dst_block_ids = dst_block_ids
        self._cond = threading.Condition()
        self._status = TransferStatus(transfer_id, TransferState.PENDING, 0, bytes_total)
        self._callbacks: list[DoneCallback] = []
        self._cancel_requested = False
        self._cancel_hook: Callable[[], None] | None = None
        self._export_done: ExportDone | None = None
        self.on_device = False
        """The pull copies blocks straight into the destination's device KV
        (``transfer.device_path``): nothing to stage from a host mirror afterwards."""

    def status(self) -> TransferStatus:
        """The current state, byte progress and, once FAILED, the reason."""
        with self._cond:
            return self._status

    @property
    def export_done(self) -> ExportDone | None:
        """What a pipelined export's prefill ended with (set when DONE; None otherwise)."""
        with self._cond:
            return self._export_done

    @property
    def state(self) -> TransferState:
        """The current :class:`TransferState`."""
        return self.status().state

    def done(self) -> bool:
        """True once DONE or FAILED."""
        return self.state.is_terminal

    def wait(self, timeout_s: float | None = None) -> TransferStatus:
        """Block until terminal or ``timeout_s`` passes; returns the status either way."""
        with self._cond:
            self._cond.wait_for(lambda: self._status.state.is_terminal, timeout=timeout_s)
            return self._status

    def result(self, timeout_s: float | None = None) -> None:
        """Wait; raise ``TransferError`` (with its reason) unless DONE.

        Raises ``TimeoutError`` if the task is still running after ``timeout_s``.
        """
        status = self.wait(timeout_s)
        if status.state is TransferState.DONE:
            return
        if status.state is TransferState.FAILED:
            raise TransferError(
                f"kv transfer {self.transfer_id} failed: {status.message}",
                reason=status.reason or TransferFailure.INTERNAL,
            )
        raise TimeoutError(f"kv transfer {self.transfer_id} still {status.state.value}")

    def add_done_callback(self, callback: DoneCallback) -> None:
        """Call ``callback(task)`` once terminal (at once, on this thread, if it already is)."""
        with self._cond:
            if not self._status.state.is_terminal:
                self._callbacks.append(callback)
                return
        callback(self)

    def as_future(self) -> Future[TransferStatus]:
        """A future resolved with the terminal status (``await asyncio.wrap_future(...)``)."""
        future: Future[TransferStatus] = Future()
        self.add_done_callback(lambda task: future.set_result(task.status()))
        return future

    def cancel(self) -> bool:
        """Ask the transfer to stop; it ends FAILED(cancelled) soon. False if already terminal."""
        with self._cond:
            if self._status.state.is_terminal:
                return False
            self._cancel_requested = True
            hook = self._cancel_hook
        if hook is not None:
            hook()
        return True

    # -- called by the import runner -------------------------------------------------------

    @property
    def cancel_requested(self) -> bool:
        """True once :meth:`cancel` was called."""
        with self._cond:
            return self._cancel_requested

    def set_cancel_hook(self, hook: Callable[[], None] | None) -> None:
        """What :meth:`cancel` calls to interrupt the running pull (e.g. ``call.cancel``)."""
        with self._cond:
            self._cancel_hook = hook
            fire = hook is not None and self._cancel_requested
        if fire and hook is not None:
            hook()

    def mark_transferring(self) -> None:
        """PENDING -> TRANSFERRING."""
        self._update(state=TransferState.TRANSFERRING)

    def mark_progress(self, bytes_done: int) -> None:
        """Record verified bytes written so far."""
        self._update(bytes_done=bytes_done)

    def mark_done(self, export_done: ExportDone | None = None) -> None:
        """-> DONE (with a pipelined export's :class:`ExportDone`); fires the callbacks."""
        with self._cond:
            if not self._status.state.is_terminal:
                self._export_done = export_done
        self._finish(TransferState.DONE, None, "", ())

    def mark_failed(
        self, reason: TransferFailure, message: str, invalid_block_ids: tuple[int, ...]
    ) -> None:
        """-> FAILED(reason); fires the callbacks."""
        self._finish(TransferState.FAILED, reason, message, invalid_block_ids)

    def _update(self, **changes: object) -> None:
        # NOTE: no notify: waiters wait for a terminal state, and waking them on every chunk
        # would cost the importing thread a GIL hand-off per chunk.
        with self._cond:
            if self._status.state.is_terminal:
                return
            self._status = dataclasses.replace(self._status, **changes)  # type: ignore[arg-type]

    def _finish(
        self,
        state: TransferState,
        reason: TransferFailure | None,
        message: str,
        invalid_block_ids: tuple[int, ...],
    ) -> None:
        with self._cond:
            if self._status.state.is_terminal:
                return
            old = self._status
            self._status = TransferStatus(
                self.transfer_id, state, old.bytes_done, old.bytes_total, reason, message,
                invalid_block_ids,
            )  # fmt: skip
            callbacks, self._callbacks = self._callbacks, []
            self._cancel_hook = None
            self._cond.notify_all()
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                logger.exception("done callback of kv transfer %s raised", self.transfer_id)
