"""The tuned policies decide exactly as the plain reference (``policy_reference.py``): same
ranking, reason and cached-block count for random pools, loads, cache and tier hits, degraded
replicas, session pins and tie breaks, and for one pool of a thousand candidates; and the same
costs, bit for bit.

Inputs keep the shape the router builds: candidate ids are distinct and hit counts are not
negative. Numbers are drawn from small sets so costs tie often (the tie order is part of the
decision) and every rule fires: no-room penalties, hot spots, live, expired and overloaded pins.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cluster.routing import policies
from cluster.routing.kv_index.holders import TierHit
from cluster.routing.policies import (
    choose_least_loaded,
    choose_prefix_aware,
    choose_round_robin,
)
from cluster.routing.policy_types import (
    CostWeights,
    HotSpotConfig,
    PoolRole,
    ReplicaLoad,
    RoutingInputs,
    SessionPin,
)
from tests.unit.cluster.routing import policy_reference as reference

NOW_S = 1000.0
MAX_PROMPT_BLOCKS = 12
REPLICA_IDS = tuple(f"r{i:02d}" for i in range(48))  # candidates draw up to 40 of these
# strategies are built once: building them per draw costs more than the policies themselves
IDS = st.sampled_from(REPLICA_IDS)
SMALL = st.integers(0, MAX_PROMPT_BLOCKS + 3)
COSTS = st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0])
# inf times a zero term is nan: an unordered cost must still sort exactly as it did
WEIGHTS = st.sampled_from([0.0, 0.1, 0.25, 1.0, 2.0, 4.0, 32.0, 1000.0, math.inf])
MOSTLY = st.sampled_from([True] * 7 + [False])
# a load is one draw from every mix of these values (a draw per field made the test 3x slower)
LOADS = st.sampled_from(
    [
        ReplicaLoad("", *fields)
        for fields in itertools.product(
            [0, 16, 300],  # num_active_tokens
            [0, 1, 5, 9],  # num_running_requests
            [0, 1, 3],  # num_queued_requests
            [0, 7, 30],  # num_used_blocks
            [None, 0, 2, 5, 9, 40],  # num_free_blocks
            [None, 0.25],  # host_block_cost
            [None, 0.0, 0.5],  # disk_block_cost
        )
    ]
)

EQUIVALENCE = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def tier_hit(draw: st.DrawFn, num_blocks: int) -> TierHit:
    """Mostly as the index reports (the media add up to the hit), sometimes not."""
    if draw(st.integers(0, 3)) > 0:
        num_host = min(draw(SMALL), num_blocks)
        num_disk = min(draw(SMALL), num_blocks - num_host)
        return TierHit(num_blocks - num_host - num_disk, num_host, num_disk)
    return TierHit(draw(SMALL), draw(SMALL), draw(SMALL))


@st.composite
def routing_inputs(draw: st.DrawFn) -> RoutingInputs:
    candidate_ids = list(REPLICA_IDS[: draw(st.integers(1, 40))])
    draw(st.randoms(use_true_random=False)).shuffle(candidate_ids)
    candidates = tuple(dataclasses.replace(draw(LOADS), replica_id=i) for i in candidate_ids)
    num_prompt_blocks = draw(st.integers(0, MAX_PROMPT_BLOCKS))
    block_size = draw(st.sampled_from([0, 1, 4, 16]))
    holders = st.sampled_from(candidate_ids) | IDS  # mostly candidates, some not
    hit_ids = draw(st.lists(holders, max_size=20, unique=True))
    cache_hits = {i: draw(SMALL) for i in hit_ids}  # up to 3 more than the prompt's blocks
    tier_ids = draw(st.lists(holders, max_size=20, unique=True))
    tiers = {i: tier_hit(draw, cache_hits.get(i, 0)) for i in tier_ids}
    if draw(MOSTLY):
        degraded = frozenset(draw(st.lists(holders, max_size=4)))
    else:  # every candidate: the decision falls back to load
        degraded = frozenset(candidate_ids)
    pin = None
    if draw(st.booleans()):
        pin = SessionPin(
            replica_id=draw(holders),
            expires_at_s=NOW_S + draw(st.sampled_from([-5.0, 0.0, 30.0, 30.0])),
        )
    return RoutingInputs(
        role=draw(st.sampled_from(PoolRole)),
        candidates=candidates,
        block_hashes=tuple(range(num_prompt_blocks)),
        block_size=block_size,
        # often a whole number of blocks: a prompt that exactly fills the free blocks fits
        num_prompt_tokens=max(
            0, draw(SMALL) * max(block_size, 1) - draw(st.sampled_from([0, 0, 1, 3]))
        ),
        cache_hits=cache_hits,
        tier_hits=tiers,
        index_available=draw(MOSTLY),
        degraded_replica_ids=degraded,
        session_pin=pin,
        now_s=NOW_S,
        tie_break=draw(st.integers(0, 100)),
    )


@st.composite
def cost_weights(draw: st.DrawFn, role: PoolRole) -> CostWeights:
    if draw(st.booleans()):
        return CostWeights.for_role(role)
    return CostWeights(
        uncached_block=draw(WEIGHTS),
        active_block=draw(WEIGHTS),
        request=draw(WEIGHTS),
        kv_usage=draw(WEIGHTS),
        no_room=draw(WEIGHTS),
        host_block_prior=draw(COSTS),
        disk_block_prior=draw(COSTS),
    )


HOT_SPOTS = st.builds(
    HotSpotConfig,
    overload_requests=st.integers(1, 10),
    overload_kv_usage=st.sampled_from([0.5, 0.8, 0.95, 1.0]),
    idle_requests=st.integers(0, 2),
)


@EQUIVALENCE
@given(data=st.data(), routing=routing_inputs(), hot_spot=HOT_SPOTS)
def test_the_policies_decide_as_the_reference(
    data: st.DataObject, routing: RoutingInputs, hot_spot: HotSpotConfig
) -> None:
    weights = data.draw(cost_weights(routing.role))
    assert choose_prefix_aware(routing, weights, hot_spot) == reference.choose_prefix_aware(
        routing, weights, hot_spot
    )
    assert choose_least_loaded(routing, weights) == reference.choose_least_loaded(routing, weights)
    assert choose_round_robin(routing) == reference.choose_round_robin(routing)
    # and every cost to the last bit: one that rounds differently ties differently elsewhere
    rotated = policies._rotated(routing)
    costs, _ = policies._total_costs(rotated, policies.usable_hits(routing), routing, weights)
    hits = reference.usable_hits(routing)
    expected = [
        reference._total_cost(c, hits.get(c.replica_id, 0), routing, weights) for c in rotated
    ]
    assert list(map(float.hex, costs)) == list(map(float.hex, expected))
    load_costs = policies._load_costs(rotated, weights, routing.block_size)
    expected = [reference.load_cost(c, weights, routing.block_size) for c in rotated]
    assert list(map(float.hex, load_costs)) == list(map(float.hex, expected))


def test_a_thousand_candidates_decide_as_the_reference() -> None:
    """The scale the tuning is for: 1,024 candidates, a 512-block prompt, 100 holders."""
    rng = random.Random(0)
    candidates = tuple(
        ReplicaLoad(
            f"replica-{i:04d}",
            num_active_tokens=rng.choice([0, 0, 512, 4096]),
            num_running_requests=rng.randrange(0, 10),
            num_queued_requests=rng.randrange(0, 3),
            num_used_blocks=rng.randrange(0, 5000),
            num_free_blocks=rng.choice([None, rng.randrange(0, 5000)]),
        )
        for i in range(1024)
    )
    holders = [*rng.sample([c.replica_id for c in candidates], 100), "gone-1", "gone-2"]
    hits = {replica_id: rng.randrange(1, 513) for replica_id in holders}
    routing = RoutingInputs(
        role=PoolRole.PREFILL,
        candidates=candidates,
        block_hashes=tuple(range(512)),
        num_prompt_tokens=512 * 16 + 3,
        cache_hits=hits,
        tier_hits={replica_id: TierHit(num_device=n) for replica_id, n in hits.items()},
        degraded_replica_ids=frozenset(holders[:5]),
        tie_break=7,
    )
    for role in PoolRole:
        weights, hot_spot = CostWeights.for_role(role), HotSpotConfig()
        assert choose_prefix_aware(routing, weights, hot_spot) == reference.choose_prefix_aware(
            routing, weights, hot_spot
        )
        assert choose_least_loaded(routing, weights) == reference.choose_least_loaded(
            routing, weights
        )
