"""The Serve caller of hot-prefix copies: every handle call runs off the calling event loop
(Serve's router loop, which a handle's first call would otherwise block on), pinned to the named
replica, with the copy's timeout."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from cluster.routing.serve_prefix_caller import ServeReplicaCaller
from core.codec import from_plain, to_plain
from core.kv_handle import KVHandle
from core.messages import PrefixCopyCall, PrefixExport, WarmPrefixRequest
from replica.prefix_warming import WarmPrefixResult

pytestmark = pytest.mark.timeout(30)

WARM = WarmPrefixRequest("decode", 1, (1, 2, 3), "holder", "target", num_bytes=3 * 64)
EXPORT = PrefixExport((1, 2), KVHandle("t", "inproc://0", 2, 64, "f", 0, "e"))


class FakeResponse:
    def __init__(self, value: Any, handle: FakeHandle) -> None:
        self.value, self.handle = value, handle

    def result(self, *, timeout_s: float | None = None) -> Any:
        self.handle.timeouts.append(timeout_s)
        return self.value


class FakeMethod:
    def __init__(self, handle: FakeHandle, name: str) -> None:
        self.handle, self.name = handle, name

    def remote(self, plain: Any) -> FakeResponse:
        """Like a first Serve call: blocks on the loop that started the copy, so it must not
        run on that loop's thread."""
        loop = self.handle.loop
        assert loop is not None
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), loop).result(timeout=5)
        call = from_plain(PrefixCopyCall, plain)
        self.handle.calls.append((self.name, call.routing.replica_id))
        if self.name == "export_prefix":
            return FakeResponse(to_plain(EXPORT), self.handle)
        return FakeResponse(to_plain(WarmPrefixResult(3, 2, 128)), self.handle)


class FakeHandle:
    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.calls: list[tuple[str, str | None]] = []
        self.timeouts: list[float | None] = []

    def __getattr__(self, name: str) -> FakeMethod:
        return FakeMethod(self, name)


def test_calls_run_off_the_loop_pinned_to_their_replicas() -> None:
    handle = FakeHandle()
    made: list[tuple[str, str, bool]] = []

    def get_handle(deployment: str, app: str) -> FakeHandle:
        made.append((deployment, app, threading.current_thread() is threading.main_thread()))
        return handle

    caller = ServeReplicaCaller("Decode", "app", timeout_s=7.5, get_handle=get_handle)  # type: ignore[arg-type]

    async def main() -> tuple[PrefixExport | None, WarmPrefixResult]:
        handle.loop = asyncio.get_running_loop()
        export = await caller.export_prefix(WARM)
        assert export is not None
        return export, await caller.warm_prefix(WARM, export)

    export, result = asyncio.run(main())
    assert export == EXPORT
    assert result == WarmPrefixResult(3, 2, 128)
    assert handle.calls == [("export_prefix", "holder"), ("warm_prefix", "target")]
    assert handle.timeouts == [7.5, 7.5]
    assert made == [("Decode", "app", False)]  # made once, in a worker thread
