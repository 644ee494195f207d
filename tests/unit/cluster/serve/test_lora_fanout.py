"""Runtime LoRA loads reach every replica of both pools through the stats board: a load returns
once each replica serves the adapter, a replica started later loads it too, a refusal on any
replica rolls the load back everywhere and raises that replica's typed error, and an unload
leaves no replica serving it. Replicas are ``ReplicaAdapters`` over a fake engine; each board
snapshot the admin reads first runs one report round (sync, then report), as replicas do."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from cluster.ingress.lora_adapters import ServedAdapter
from cluster.serve.lora_admin import ServeLoRAAdmin
from cluster.serve.stats_board import StatsBoard
from core.codec import from_plain, to_plain
from core.errors import LoRARankError
from core.lora_registry import RegisteredAdapter
from core.stats import ReplicaReport, ReplicaStats
from engine.lora import LoRARequest
from replica.lora_adapters import ReplicaAdapters

pytestmark = pytest.mark.timeout(30)


@dataclass
class FakeLLMEngine:
    loaded: list[str] = field(default_factory=list)

    def add_lora(self, request: LoRARequest) -> None:
        if "big" in request.lora_path:
            raise LoRARankError(f"adapter {request.lora_name!r} has rank 64 > 16", param="x")
        self.loaded.append(request.lora_name)

    def remove_lora(self, lora_name: str) -> bool:
        self.loaded.remove(lora_name)
        return True


@dataclass
class FakeEngine:
    llm: FakeLLMEngine = field(default_factory=FakeLLMEngine)

    async def call(self, fn: Callable[[FakeLLMEngine], Any]) -> Any:
        return fn(self.llm)


@dataclass
class Replica:
    replica_id: str
    role: str
    refuses: bool = False
    adapters: ReplicaAdapters = field(default_factory=ReplicaAdapters)
    engine: FakeEngine = field(default_factory=FakeEngine)

    async def report_round(self, board: StatsBoard) -> None:
        registered = [from_plain(RegisteredAdapter, a) for a in board.adapters("")]
        await self.adapters.sync(self.engine, registered)  # type: ignore[arg-type]
        stats = ReplicaStats(
            served_adapters=self.adapters.names(), adapter_refusals=self.adapters.refusals()
        )
        report = ReplicaReport(self.role, self.replica_id, "", "n", "127.0.0.1", 1, stats)
        board.report(to_plain(report))


class Method:
    def __init__(self, call: Callable[..., Any]) -> None:
        self._call = call

    async def remote(self, *args: Any) -> Any:
        return await self._call(*args)


class BoardHandle:
    """The board as a Serve handle; ``snapshot`` runs a report round of every replica first."""

    def __init__(self, board: StatsBoard, replicas: list[Replica]) -> None:
        self.board, self.replicas = board, replicas

    def __getattr__(self, name: str) -> Method:
        async def call(*args: Any) -> Any:
            if name == "snapshot":
                for replica in self.replicas:
                    await replica.report_round(self.board)
            return getattr(self.board, name)(*args)

        return Method(call)


def cluster(*replicas: Replica) -> tuple[ServeLoRAAdmin, BoardHandle]:
    handle = BoardHandle(StatsBoard(), list(replicas))
    return ServeLoRAAdmin(handle, {"base": ""}, timeout_s=5.0), handle  # type: ignore[arg-type]


def test_a_load_reaches_every_replica_and_later_ones() -> None:
    prefill, decode = Replica("p0", "prefill"), Replica("d0", "decode")
    admin, handle = cluster(prefill, decode)
    asyncio.run(admin.load(ServedAdapter("sql", "base", "/a/sql")))
    assert prefill.adapters.names() == decode.adapters.names() == ("sql",)
    assert prefill.adapters.resolve("sql") == LoRARequest("sql", 1, "/a/sql")
    late = Replica("d1", "decode")
    handle.replicas.append(late)
    asyncio.run(late.report_round(handle.board))
    assert late.adapters.names() == ("sql",) and late.engine.llm.loaded == ["sql"]


def test_a_refusal_on_one_replica_rolls_the_load_back_everywhere() -> None:
    good, other = Replica("p0", "prefill"), Replica("d0", "decode")
    admin, handle = cluster(good, other)
    with pytest.raises(LoRARankError, match="'huge' has rank 64 > 16"):
        asyncio.run(admin.load(ServedAdapter("huge", "base", "/a/big")))
    assert handle.board.adapters("") == []
    asyncio.run(good.report_round(handle.board))
    assert good.adapters.names() == () and good.adapters.refusals() == ()


def test_an_unload_leaves_no_replica_serving_it() -> None:
    replicas = Replica("p0", "prefill"), Replica("d0", "decode"), Replica("d1", "decode")
    admin, _ = cluster(*replicas)
    adapter = ServedAdapter("chat", "base", "/a/chat")
    asyncio.run(admin.load(adapter))
    asyncio.run(admin.unload(adapter))
    assert all(r.adapters.names() == () for r in replicas)
    with pytest.raises(Exception, match="not loaded on this replica"):
        replicas[0].adapters.resolve("chat")


def test_the_registry_every_ingress_reads_follows_loads_and_unloads() -> None:
    admin, _ = cluster(Replica("p0", "prefill"), Replica("d0", "decode"))
    adapter = ServedAdapter("sql", "base", "/a/sql")
    assert admin.bases == ("base",) and asyncio.run(admin.registered()) == []
    asyncio.run(admin.load(adapter))
    assert asyncio.run(admin.registered()) == [adapter]
    asyncio.run(admin.unload(adapter))
    assert asyncio.run(admin.registered()) == []
