"""Prometheus families of the LoRA adapters, read from each replica's
``ReplicaStats.lora_adapters``.

``pdserve:lora_requests_info`` is vLLM's ``lora_requests_info`` per (model, role): a gauge whose
labels name the adapters with requests in the latest steps (``running_lora_adapters``), those
with admitted requests outside them (``waiting_lora_adapters``, comma-separated) and
``max_lora``; its value is the scrape time, as in vLLM. Per replica and adapter:
``pdserve:lora_adapter_residency`` (1 with ``residency`` ``device`` or ``host``; a cold adapter
has no series) and ``pdserve:lora_adapter_requests`` (requests run under it since the replica
started).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from cluster.ingress.telemetry.tier_metrics import PoolLabels
from core.stats import ReplicaStats

_POOL = ["model_name", "role"]


def lora_families(
    live: Mapping[PoolLabels, Mapping[str, ReplicaStats]], now_s: float | None = None
) -> Iterator[Metric]:
    """The LoRA families of the live replicas (pool -> replica id -> stats)."""
    info = GaugeMetricFamily(
        "pdserve:lora_requests_info",
        "Running and waiting LoRA adapters and max_lora (vLLM's lora_requests_info).",
        labels=[*_POOL, "running_lora_adapters", "waiting_lora_adapters", "max_lora"],
    )
    residency = GaugeMetricFamily(
        "pdserve:lora_adapter_residency",
        "A LoRA adapter loaded on a replica, by where it is (device slot or host memory).",
        labels=[*_POOL, "replica", "lora_name", "residency"],
    )
    requests = CounterMetricFamily(
        "pdserve:lora_adapter_requests",
        "Requests a replica ran under a LoRA adapter.",
        labels=[*_POOL, "replica", "lora_name"],
    )
    stamp = time.time() if now_s is None else now_s
    for pool, replicas in sorted(live.items()):
        max_lora = max((s.max_loras for s in replicas.values()), default=0)
        if not max_lora:
            continue
        running, waiting = set(), set()
        for replica_id, stats in sorted(replicas.items()):
            for adapter in stats.lora_adapters:
                if adapter.num_running:
                    running.add(adapter.name)
                if adapter.num_waiting:
                    waiting.add(adapter.name)
                labels = [*pool, replica_id, adapter.name]
                residency.add_metric([*labels, adapter.residency], 1.0)
                requests.add_metric(labels, float(adapter.requests_total))
        adapters = [",".join(sorted(running)), ",".join(sorted(waiting)), str(max_lora)]
        info.add_metric([*pool, *adapters], stamp)
    yield from (info, residency, requests)
