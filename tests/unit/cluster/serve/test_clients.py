"""The Serve clients: plain messages out, typed replies back, and a cancelled call cancelled
on the replica too (no Ray cluster: a stand-in handle)."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

import pytest

from cluster.serve.clients import PoolWatch, ServePrefillClient
from core.codec import from_plain, to_plain
from core.errors import ErrorReport, SamplingParamsError
from core.messages import PrefillReply, PrefillRequest, PrefillResult, RoutingKeys
from core.sampling import SamplingParams

REQUEST = PrefillRequest("cmpl-1", [1, 2, 3, 4], SamplingParams(max_tokens=2), RoutingKeys((7,), 4))


class Response:
    """What ``handle.remote()`` returns: awaitable, cancellable."""

    def __init__(self, reply: dict[str, Any] | None) -> None:
        self.reply = reply
        self.cancelled = False
        self.future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        if reply is not None:
            self.future.set_result(reply)

    def __await__(self) -> Generator[Any, None, dict[str, Any]]:
        return self.future.__await__()

    def cancel(self) -> None:
        self.cancelled = True


class Handle:
    """A stand-in ``DeploymentHandle`` for the Prefill deployment."""

    def __init__(self, reply: dict[str, Any] | None) -> None:
        self.reply = reply
        self.sent: list[dict[str, Any]] = []
        self.responses: list[Response] = []

    def options(self, **_: Any) -> Handle:
        return self

    def remote(self, payload: dict[str, Any]) -> Response:
        self.sent.append(payload)
        self.responses.append(Response(self.reply))
        return self.responses[-1]


def client(handle: Handle) -> ServePrefillClient:
    return ServePrefillClient(handle, PoolWatch(board=None))  # type: ignore[arg-type]


def test_sends_the_plain_message_and_returns_the_typed_result() -> None:
    result = PrefillResult("cmpl-1", 9, "x", 0, None, "stop")
    handle = Handle(to_plain(PrefillReply(result=result)))
    assert asyncio.run(client(handle).prefill(REQUEST)) == result
    assert from_plain(PrefillRequest, handle.sent[0]) == REQUEST


def test_a_reported_error_is_raised_as_its_class() -> None:
    error = SamplingParamsError("seed out of range", param="seed")
    handle = Handle(to_plain(PrefillReply(error=ErrorReport.of(error))))
    with pytest.raises(SamplingParamsError) as info:
        asyncio.run(client(handle).prefill(REQUEST))
    assert info.value.param == "seed"


def test_a_timed_out_prefill_is_cancelled_on_the_replica() -> None:
    handle = Handle(None)  # the replica never answers

    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await client(handle).prefill(REQUEST)

    asyncio.run(main())
    assert [r.cancelled for r in handle.responses] == [True]
