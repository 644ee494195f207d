"""``/metrics``: Prometheus text with vLLM-like names, request latencies and worker gauges."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from cluster.ingress.telemetry.worker_stats import WorkerStatsCollector
from core.stats import KVTierStats, ReplicaStats, SpecDecodeStats, TransferStats
from tests.unit.cluster.ingress.fakes import MODEL, FakeDecode, Harness, run

LONG = "hello world, this is a long prompt"


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: Mapping[Any, float], name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def worker(found: Mapping[Any, float], name: str, role: str, **labels: str) -> float | None:
    """A worker family's sample of ``role``'s pool of the test model."""
    return value(found, name, model_name=MODEL, role=role, **labels)


async def scrape_after(h: Harness, bodies: Sequence[tuple[str, dict[str, Any]]]) -> Any:
    async with h.client() as client:
        for path, body in bodies:
            await client.post(path, json={"model": MODEL, **body})
        return await client.get("/metrics")


def test_request_metrics(make_harness: Callable[..., Harness]) -> None:
    h = make_harness()
    r = run(
        scrape_after(
            h,
            [
                ("/v1/completions", {"prompt": LONG, "stream": True}),
                ("/v1/completions", {"prompt": "hi"}),
                ("/v1/completions", {"prompt": "hi", "temperature": -3}),
                ("/v1/completions", {"model": "other", "prompt": "hi"}),
            ],
        )
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    found = samples(r.text)
    remote = {"model_name": MODEL, "role": "ingress", "prefill": "remote"}
    local = {**remote, "prefill": "local"}
    assert value(found, "pdserve:time_to_first_token_seconds_count", **remote) == 1.0
    assert value(found, "pdserve:time_to_first_token_seconds_count", **local) == 1.0
    assert value(found, "pdserve:inter_token_latency_seconds_count", **remote) == 2.0
    assert value(found, "pdserve:e2e_request_latency_seconds_count", **local) == 1.0
    tokens = {"model_name": MODEL, "role": "ingress"}
    assert value(found, "pdserve:generation_tokens_total", **tokens) == 6.0
    assert value(found, "pdserve:prompt_tokens_total", **tokens) == 35.0 + 3.0
    assert value(found, "pdserve:prompt_tokens_cached_total", **tokens) == 16.0
    success = {**tokens, "finished_reason": "length"}
    assert value(found, "pdserve:request_success_total", **success) == 2.0
    assert value(found, "pdserve:disagg_decisions_total", decision="remote", reason="long_prompt")
    assert value(found, "pdserve:requests_rejected_total", reason="invalid_request") == 1.0
    assert value(found, "pdserve:requests_rejected_total", reason="model_not_found") == 1.0
    assert value(found, "pdserve:requests_in_flight", role="ingress") == 0.0


def test_rejections_by_reason(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(api_keys=frozenset({"k"}))

    async def scenario() -> Any:
        async with h.client() as client:
            await client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
            await client.get("/v1/models")
            h.app.gate.start_draining()
            headers = {"authorization": "Bearer k"}
            await client.post("/v1/completions", json={"prompt": "hi"}, headers=headers)
            return await client.get("/metrics", headers=headers)

    found = samples(run(scenario()).text)
    assert value(found, "pdserve:requests_rejected_total", reason="unauthorized") == 2.0
    assert value(found, "pdserve:requests_rejected_total", reason="draining") == 1.0


def test_worker_stats_per_role(make_harness: Callable[..., Harness]) -> None:
    calls = []

    async def stats() -> dict[str, dict[str, ReplicaStats]]:
        calls.append(1)
        prefill = ReplicaStats(
            kv_blocks_used=3,
            kv_blocks_free=5,
            kv_blocks_total=8,
            exports_pinned=1,
            transfer=TransferStats(
                in_flight=2,
                bytes_total=4096,
                failures_total=3,
                failures_by_reason={"lease_expired": 2, "corrupt_chunk": 1},
            ),
        )
        decode = ReplicaStats(
            kv_blocks_used=10,
            kv_blocks_free=6,
            num_running=2,
            transfer=TransferStats(
                failures_total=1,
                failures_by_reason={"deadline_exceeded": 1},
                seconds_total=0.5,
                pulls_by_path={"same_node": 3, "grpc": 1},
                same_node_fallbacks_by_reason={"other_node": 1},
            ),
        )
        return {"prefill": {"p1": prefill}, "decode": {"d1": decode, "d2": decode}}

    h = make_harness(stats_provider=stats)
    found = samples(run(scrape_after(h, [])).text)
    assert calls == [1]
    assert worker(found, "pdserve:kv_blocks_used", "prefill") == 3.0
    assert worker(found, "pdserve:kv_blocks_free", "prefill") == 5.0
    assert worker(found, "pdserve:kv_blocks_used", "decode") == 20.0  # summed over replicas
    assert worker(found, "pdserve:kv_blocks_free", "decode") == 12.0
    assert worker(found, "pdserve:replicas", "decode") == 2.0
    assert worker(found, "pdserve:num_requests_running", "decode") == 4.0
    assert worker(found, "pdserve:kv_exports_pinned", "prefill") == 1.0
    assert worker(found, "pdserve:transfer_in_flight", "prefill") == 2.0
    assert worker(found, "pdserve:transfer_bytes_total", "prefill") == 4096.0
    assert worker(found, "pdserve:transfer_seconds_total", "decode") == 1.0
    failures = "pdserve:transfer_failures_total"
    assert worker(found, failures, "prefill", reason="lease_expired") == 2.0
    assert worker(found, failures, "prefill", reason="corrupt_chunk") == 1.0
    assert worker(found, failures, "decode", reason="deadline_exceeded") == 2.0
    pulls = "pdserve:kv_transfer_pulls_total"
    assert worker(found, pulls, "decode", path="same_node") == 6.0
    assert worker(found, pulls, "decode", path="grpc") == 2.0
    fallbacks = "pdserve:kv_same_node_fallbacks_total"
    assert worker(found, fallbacks, "decode", reason="other_node") == 2.0


def test_counters_never_go_down_when_a_replica_is_replaced() -> None:
    collector = WorkerStatsCollector(MODEL)

    def prefill(expired: int, failures: int, blocks: int) -> ReplicaStats:
        transfer = TransferStats(
            leases_expired_total=expired,
            unauthenticated_calls_total=1,
            failures_by_reason={"lease_expired": failures},
        )
        return ReplicaStats(kv_blocks_used=blocks, transfer=transfer)

    def scrape() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        registry = CollectorRegistry()
        registry.register(collector)
        return samples(generate_latest(registry).decode())

    collector.update({"prefill": {"a": prefill(3, 2, 5), "b": prefill(1, 0, 1)}})
    before = scrape()
    collector.update({"prefill": {"b": prefill(1, 0, 1), "c": prefill(0, 0, 0)}})  # a died
    after = scrape()
    expired = "pdserve:kv_leases_expired_total"
    assert worker(before, expired, "prefill") == worker(after, expired, "prefill") == 4.0
    failures = "pdserve:transfer_failures_total"
    assert worker(after, failures, "prefill", reason="lease_expired") == 2.0
    assert worker(after, "pdserve:transfer_unauthenticated_calls_total", "prefill") == 3.0
    assert worker(after, "pdserve:kv_blocks_used", "prefill") == 1.0  # gauges: live only
    collector.update({"prefill": {"a": prefill(5, 2, 2), "b": prefill(1, 0, 1)}})  # a is back
    assert worker(scrape(), expired, "prefill") == 6.0  # a counted once, c kept


def test_broken_stats_provider_does_not_break_the_scrape(
    make_harness: Callable[..., Harness],
) -> None:
    async def broken() -> dict[str, list[dict[str, float]]]:
        raise RuntimeError("controller unreachable")

    h = make_harness(stats_provider=broken, decode=FakeDecode())
    r = run(scrape_after(h, [("/v1/completions", {"prompt": "hi"})]))
    assert r.status_code == 200
    assert "pdserve:time_to_first_token_seconds" in r.text


def test_each_app_has_its_own_registry(make_harness: Callable[..., Harness]) -> None:
    first, second = make_harness(), make_harness()
    run(scrape_after(first, [("/v1/completions", {"prompt": "hi"})]))
    found = samples(run(scrape_after(second, [])).text)
    tokens = {"model_name": MODEL, "role": "ingress"}
    assert value(found, "pdserve:generation_tokens_total", **tokens) is None


def test_tier_metrics_per_role_and_tier() -> None:
    collector = WorkerStatsCollector(MODEL)
    registry = CollectorRegistry()
    registry.register(collector)

    def decode(host_hits: int, used: int) -> ReplicaStats:
        return ReplicaStats(
            kv_tiers=(
                KVTierStats("device", blocks_used=used, blocks_capacity=100, hits_total=7),
                KVTierStats(
                    "host",
                    blocks_used=2 * used,
                    blocks_capacity=400,
                    hits_total=host_hits,
                    onload_bytes_total=4096,
                    ttl_expiries_total=1,
                ),
            )
        )

    collector.update({"decode": {"a": decode(3, 10), "b": decode(4, 20)}})
    collector.update({"decode": {"b": decode(5, 20)}})  # a died: its counters stay
    scraped = samples(generate_latest(registry).decode())
    assert worker(scraped, "pdserve:kv_tier_hits_total", "decode", tier="host") == 8.0
    assert worker(scraped, "pdserve:kv_tier_hits_total", "decode", tier="device") == 14.0
    assert worker(scraped, "pdserve:kv_tier_blocks_used", "decode", tier="host") == 40.0
    assert worker(scraped, "pdserve:kv_tier_blocks_capacity", "decode", tier="device") == 100
    assert worker(scraped, "pdserve:kv_tier_onload_bytes_total", "decode", tier="host") == 8192
    assert worker(scraped, "pdserve:kv_tier_ttl_expiries_total", "decode", tier="host") == 2.0


def test_speculative_decoding_counters_sum_over_the_decode_replicas() -> None:
    collector = WorkerStatsCollector(MODEL)
    registry = CollectorRegistry()
    registry.register(collector)

    def decode(drafts: int, accepted_per_pos: tuple[int, ...]) -> ReplicaStats:
        spec = SpecDecodeStats(drafts, 4 * drafts, sum(accepted_per_pos), accepted_per_pos)
        return ReplicaStats(spec_decode=spec)

    collector.update({"decode": {"a": decode(10, (8, 5, 2)), "b": decode(6, (4, 1))}})
    scraped = samples(generate_latest(registry).decode())
    assert worker(scraped, "pdserve:spec_decode_num_drafts_total", "decode") == 16
    assert worker(scraped, "pdserve:spec_decode_num_draft_tokens_total", "decode") == 64
    assert worker(scraped, "pdserve:spec_decode_num_accepted_tokens_total", "decode") == 20
    per_pos = "pdserve:spec_decode_num_accepted_tokens_per_pos_total"
    assert [worker(scraped, per_pos, "decode", position=str(i)) for i in range(3)] == [12, 6, 2]
