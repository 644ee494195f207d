"""``/metrics`` for LoRA: vLLM's lora_requests_info per pool, each replica's adapters by
residency and their request counters."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from cluster.ingress.telemetry.worker_stats import WorkerStatsCollector
from core.stats import LoRAAdapterStats, ReplicaStats
from tests.unit.cluster.ingress.fakes import MODEL
from tests.unit.cluster.ingress.test_metrics import samples, worker


def test_lora_families_per_pool_and_replica() -> None:
    collector = WorkerStatsCollector(MODEL)
    registry = CollectorRegistry()
    registry.register(collector)
    a = ReplicaStats(
        max_loras=4,
        lora_adapters=(
            LoRAAdapterStats("sql", "device", requests_total=7, num_running=2),
            LoRAAdapterStats("chat", "host", requests_total=1, num_waiting=1),
        ),
    )
    b = ReplicaStats(max_loras=4, lora_adapters=(LoRAAdapterStats("sql", "device", 3),))
    collector.update({"decode": {"a": a, "b": b}, "prefill": {"p": ReplicaStats()}})
    scraped = samples(generate_latest(registry).decode())
    info = {k: v for k, v in scraped.items() if k[0] == "pdserve:lora_requests_info"}
    ((_, labels),) = info
    assert dict(labels) == {
        "model_name": MODEL,
        "role": "decode",
        "running_lora_adapters": "sql",
        "waiting_lora_adapters": "chat",
        "max_lora": "4",
    }
    residency = "pdserve:lora_adapter_residency"
    assert worker(scraped, residency, "decode", replica="a", lora_name="sql", residency="device")
    assert worker(scraped, residency, "decode", replica="a", lora_name="chat", residency="host")
    requests = "pdserve:lora_adapter_requests_total"
    assert worker(scraped, requests, "decode", replica="a", lora_name="sql") == 7
    assert worker(scraped, requests, "decode", replica="b", lora_name="sql") == 3
    assert worker(scraped, requests, "prefill", replica="p", lora_name="sql") is None
