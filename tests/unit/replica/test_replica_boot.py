"""One boot for both roles: a replica decodes its spec, starts its KV-event feed, builds its worker
from what the boot prepared, reports, and on the stop drains, ends its reports and its feed,
then shuts the worker down; a boot that fails closes the feed it had started."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from core.codec import from_plain, to_plain
from core.config import EngineConfig, ModelConfig, TransferConfig
from core.errors import ConfigError, MessageError
from core.kv_compat import KVCompat
from core.kv_events import KVEventBatch
from core.messages import PrefixCopyCall, RoutingKeys, WarmPrefixRequest
from core.stats import ReplicaStats
from core.transfer_faults import FaultInjection
from replica import (
    KVToken,
    ReplicaHooks,
    ReplicaIdentity,
    ReplicaSpec,
    RoleReplica,
    WorkerBoot,
)
from replica.lora_adapters import ReplicaAdapters

SPEC = ReplicaSpec(
    role="decode",
    model=ModelConfig(name="builtin:tiny-llama"),
    engine=EngineConfig(block_size=8, max_num_seqs=4),
    transfer=TransferConfig(lease_s=7.0, auth_token_env="PDSERVE_TEST_BOOT_TOKEN"),
    kv_failure_policy="fail",
    kv_token=KVToken("s3cret"),
)


class FakeEngine:
    driver = None

    def is_running(self) -> bool:
        return True

    def kv_stats(self) -> ReplicaStats:
        return ReplicaStats()


@dataclass
class FakeWorker:
    boot: WorkerBoot
    events: list[str]
    engine: FakeEngine = field(default_factory=FakeEngine)
    kv_compat: KVCompat | None = None
    adapters: ReplicaAdapters = field(default_factory=ReplicaAdapters)

    def stats(self) -> ReplicaStats:
        return ReplicaStats(num_running=3)

    async def drain(self, timeout_s: float) -> int:
        self.events.append(f"drain {timeout_s}")
        return 0

    async def shutdown(self) -> None:
        self.events.append("shutdown")


@dataclass
class Publisher:
    events: list[str]

    def callback(self, batch: KVEventBatch) -> None:
        self.events.append("event")

    def close(self) -> None:
        self.events.append("publisher closed")


@dataclass
class PublisherFactory:
    events: list[str]

    def start(self, replica_id: str, app_name: str) -> Publisher:
        self.events.append(f"publish {replica_id}@{app_name}")
        return Publisher(self.events)


@dataclass(frozen=True)
class FixedIdentity:
    def current(self) -> ReplicaIdentity:
        return ReplicaIdentity("r-1", "app", node_host="10.0.0.7")


class FakeDecode(RoleReplica[FakeWorker]):
    role = "decode"
    events: list[str]
    fail_build = False

    def build_worker(self, boot: WorkerBoot) -> FakeWorker:
        if self.fail_build:
            raise ConfigError("no such model", param="model")
        self.events.append("build")
        return FakeWorker(boot, self.events)

    def fault_handler(self) -> Callable[[FaultInjection], None]:
        return lambda faults: self.events.append("faults")

    def drain_timeout_s(self) -> float:
        return self.spec.transfer.lease_s


def reporter(events: list[str]) -> Any:
    def start(
        role: str,
        stats: Callable[[], ReplicaStats],
        on_faults: Any = None,
        on_adapters: Any = None,
        on_hand_off: Any = None,
    ) -> Any:
        events.append(f"report {role} {stats().num_running}")
        on_faults(FaultInjection())
        return lambda: events.append("reports stopped")

    return start


def boot(events: list[str], *, fail: bool = False) -> FakeDecode:
    cls = type("Booted", (FakeDecode,), {"events": events, "fail_build": fail})
    hooks = ReplicaHooks(
        identity=FixedIdentity(),
        stats_reporter=reporter(events),
        kv_events=PublisherFactory(events),
    )
    replica: FakeDecode = cls(to_plain(SPEC), hooks)
    return replica


def test_the_spec_round_trips_as_plain_data() -> None:
    plain = to_plain(SPEC)
    assert plain["engine"]["block_size"] == 8
    again = from_plain(ReplicaSpec, plain)
    assert again == SPEC
    assert isinstance(again.model, ModelConfig)


def test_a_bad_spec_is_refused_naming_the_field() -> None:
    plain = to_plain(SPEC)
    plain["kv_failure_policy"] = "retry"
    with pytest.raises(MessageError, match="kv_failure_policy"):
        from_plain(ReplicaSpec, plain)
    plain = to_plain(SPEC)
    plain["engine"]["block_size"] = -1
    with pytest.raises(MessageError, match="block_size"):
        from_plain(ReplicaSpec, plain)


def test_boot_order_and_what_the_worker_gets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PDSERVE_TEST_BOOT_TOKEN", raising=False)
    events: list[str] = []
    replica = boot(events)
    assert events == ["publish r-1@app", "build", "report decode 3", "faults"]
    worker_boot = replica.worker.boot
    assert worker_boot.spec == SPEC
    assert worker_boot.node_host == "10.0.0.7"
    assert worker_boot.engine is None  # no gang: the role builds its own
    assert worker_boot.kv_event_callback is not None
    assert worker_boot.transfer.auth_token_env == "PDSERVE_TEST_BOOT_TOKEN"
    replica.count_request()
    assert replica.replica_stats().requests_total == 1
    assert replica.replica_stats().num_running == 3
    stop(replica)


def stop(replica: FakeDecode) -> None:
    coroutine = replica.__del__()
    assert coroutine is not None
    asyncio.run(coroutine)


def test_the_stop_drains_then_ends_reports_feed_and_worker() -> None:
    events: list[str] = []
    replica = boot(events)
    events.clear()
    stop(replica)
    assert events == ["drain 7.0", "reports stopped", "publisher closed", "shutdown"]
    assert replica.__del__() is None  # the garbage collector's call does nothing again


def test_a_failed_boot_closes_the_feed_it_started() -> None:
    events: list[str] = []
    with pytest.raises(ConfigError, match="no such model"):
        boot(events, fail=True)
    assert events == ["publish r-1@app", "publisher closed"]


def test_a_spec_of_the_other_role_is_refused() -> None:
    events: list[str] = []
    cls = type("Booted", (FakeDecode,), {"events": events})
    with pytest.raises(ConfigError, match="a decode replica got a prefill spec"):
        cls(to_plain(ReplicaSpec("prefill", SPEC.model, SPEC.engine, SPEC.transfer)))
    assert events == []


def test_a_warm_prefix_call_without_the_holders_export_is_refused() -> None:
    events: list[str] = []
    replica = boot(events)
    call = PrefixCopyCall(
        WarmPrefixRequest("decode", 1, (1, 2), "holder", "r-1"), RoutingKeys(replica_id="r-1")
    )
    with pytest.raises(MessageError, match="export"):
        asyncio.run(asyncio.wait_for(replica.warm_prefix(to_plain(call)), timeout=5.0))
    assert replica._prefix_copies is None  # nothing was made for it
    stop(replica)
