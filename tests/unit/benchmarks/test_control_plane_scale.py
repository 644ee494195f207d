"""The control-plane harness on a small fleet, in-process: its stated rates follow from the GPU
figures, the workload hits the index, and its routing, memory and board figures come out."""

from __future__ import annotations

from benchmarks.control_plane_scale import (
    Fleet,
    build_index,
    measure_memory,
    measure_routing,
    measure_stats_board,
    parse_args,
    stated_rates,
)


def test_stated_rates_follow_from_the_gpu_figures() -> None:
    rates = stated_rates()
    assert rates.prefill_events_per_s == 12_500  # 100K tokens/s in 16-token blocks, x2
    assert rates.decode_events_per_s == 82_500  # 78 requests/s of 512 blocks + outputs, x2
    assert 0.86 < rates.prefill_share < 0.87  # 6.4 prefill replicas per decode replica
    assert rates.events_per_s(1024, stride=16) == rates.events_per_s(1024) / 16


def test_the_workload_continues_cached_sessions() -> None:
    import random

    rng = random.Random(0)
    fleet = Fleet.build(8, 300, rng)
    index = build_index(fleet, "prefill")
    hits = [
        max(index.match("prefill", fleet.prompt(64, rng)).values(), default=0) for _ in range(50)
    ]
    assert sum(h == 64 for h in hits) > 20  # most continue a session held in full
    assert all(h >= 1 for h in hits)  # every prompt starts with a cached system prompt
    assert index.stats().num_entries == 8 * 300


def test_routing_memory_and_board_figures_on_a_small_fleet() -> None:
    args = parse_args(
        ["--decisions", "20", "--blocks-per-replica", "200", "--memory-replicas", "16"]
    )
    route = measure_routing(16, [512, 2048], args)
    assert set(route) == {"512", "2048"}
    assert all(0 < r["p50_ms"] <= r["p99_ms"] for r in route.values())
    memory = measure_memory(args)
    assert memory["num_entries"] == 16 * 200 and 0 < memory["index_bytes_per_block"] < 400
    board = measure_stats_board(32)
    assert board["snapshot_bytes"] > 0 and board["report_us"] > 0
