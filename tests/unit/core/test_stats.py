"""Replica stats: the measured load-to-recompute ratio each tier reports to the routers."""

from __future__ import annotations

import dataclasses

import pytest

from core.codec import from_plain, to_plain
from core.sampling import SamplingParams
from core.stats import KVTierStats, ReplicaStats, RoutingStats
from engine.prefill_rate import PrefillRate
from engine.scheduler.output import ScheduledRequest


def test_tier_costs_are_load_time_over_recompute_time_per_block() -> None:
    stats = ReplicaStats(
        kv_tiers=(
            KVTierStats("device"),
            KVTierStats("host", onload_seconds_total=0.02, onload_blocks_total=10),
            KVTierStats("disk", onload_seconds_total=0.1, onload_blocks_total=10),
        ),
        kv_block_size=16,
        prefill_tokens_total=1600,
        prefill_seconds_total=1.0,  # 10 ms per 16-token block
    )
    routing = stats.routing()
    assert routing.host_block_cost == pytest.approx(0.2)
    assert routing.disk_block_cost == pytest.approx(1.0)
    assert from_plain(RoutingStats, to_plain(routing)) == routing


def test_tier_costs_are_unknown_until_both_sides_were_measured() -> None:
    host = KVTierStats("host", onload_seconds_total=0.02, onload_blocks_total=10)
    assert ReplicaStats(kv_tiers=(host,), kv_block_size=16).routing().host_block_cost is None
    no_loads = ReplicaStats(
        kv_tiers=(KVTierStats("host"),),
        kv_block_size=16,
        prefill_tokens_total=16,
        prefill_seconds_total=1.0,
    )
    assert no_loads.routing().host_block_cost is None
    assert no_loads.routing().disk_block_cost is None


def scheduled(num_tokens: int) -> ScheduledRequest:
    return ScheduledRequest(
        request_id="r",
        token_ids=[1] * num_tokens,
        start_position=0,
        block_ids=[0],
        samples_token=True,
        sampling_params=SamplingParams(),
        num_output_tokens=0,
    )


def test_prefill_rate_charges_prompt_tokens_their_share_of_a_step() -> None:
    rate = PrefillRate()
    assert rate.seconds_per_token is None
    rate.record([scheduled(1), scheduled(1)], 0.5)  # decode only: not prompt work
    rate.record([scheduled(6), scheduled(1), scheduled(1)], 0.8)  # 6 of 8 tokens are prompt
    assert rate.tokens_total == 6
    assert rate.seconds_total == pytest.approx(0.6)
    assert rate.seconds_per_token == pytest.approx(0.1)


def test_prefill_rate_leaves_verify_rows_out() -> None:
    rate = PrefillRate()
    verify = dataclasses.replace(scheduled(4), draft_token_ids=(1, 1, 1))
    rate.record([verify, scheduled(1)], 0.5)  # a last token + 3 drafts: decode work
    assert rate.tokens_total == 0
    rate.record([scheduled(4), verify], 0.8)  # 4 of 8 tokens are prompt
    assert rate.seconds_total == pytest.approx(0.4)


def test_routing_stats_carry_the_measured_prefill_rate_queue_and_block_bytes() -> None:
    fresh = ReplicaStats().routing()
    assert (fresh.prefill_tokens_per_s, fresh.pending_prompt_tokens, fresh.kv_block_bytes) == (
        None,
        0,
        0,
    )
    busy = ReplicaStats(
        prefill_tokens_total=3000,
        prefill_seconds_total=0.5,
        pending_prompt_tokens=700,
        kv_block_bytes=2048,
    ).routing()
    assert busy.prefill_tokens_per_s == pytest.approx(6000.0)
    assert (busy.pending_prompt_tokens, busy.kv_block_bytes) == (700, 2048)
