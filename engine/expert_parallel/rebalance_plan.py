"""The expert-parallel load balancer's plan: where the redundant copies of hot experts go.

:func:`rebalance_placement` is a pure function of a base placement (whose primaries never move),
per-expert token counts and a copy budget, so every rank of a gang given the same counts computes
the same plan (the ranks check the fingerprint). The model of load matches the router
(:meth:`ExpertPlacement.expected_load`): an expert's tokens split evenly over its holders.

Greedy, as in DeepSeek's EPLB: the next copy goes to the expert with the most tokens per
existing holder, on the least-loaded rank that does not hold it yet, provided that rank, with
its share of the expert, stays below the expert's busiest holder (so the busiest rank's load
never grows); when no copy helps, the rest of the budget stays unused. A rank may take several
copies (up to ``num_copies``): a cold rank should absorb a hot rank's experts, and a fixed
number of slots per rank would force copies onto the hot ranks too.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.errors import ConfigError
from engine.expert_parallel.placement import ExpertPlacement


def rebalance_placement(
    base: ExpertPlacement, tokens_per_expert: Sequence[int], num_copies: int
) -> ExpertPlacement:
    """``base``'s primaries plus ``num_copies`` redundant copies placed to even out rank load.

    Ignores ``base``'s own copies. Raises :class:`ConfigError` (``eplb.redundant_experts``) when
    ``num_copies`` exceeds what the gang can hold, and for negative or misshapen counts.
    """
    _check_inputs(base, tokens_per_expert, num_copies)
    num_ranks = base.num_ranks
    owner = {e: r for r, ids in enumerate(base.primary) for e in ids}
    holders = {e: [owner[e]] for e in range(base.num_experts)}
    load = [0.0] * num_ranks
    for expert_id, tokens in enumerate(tokens_per_expert):
        load[owner[expert_id]] += tokens
    copies: list[list[int]] = [[] for _ in range(num_ranks)]
    for _ in range(num_copies):
        choice = _next_copy(tokens_per_expert, holders, load)
        if choice is None:
            break  # no copy would move load from a busier rank to a less busy one
        expert_id, rank = choice
        tokens = tokens_per_expert[expert_id]
        before = len(holders[expert_id])
        for holder in holders[expert_id]:
            load[holder] -= tokens / before - tokens / (before + 1)
        load[rank] += tokens / (before + 1)
        holders[expert_id].append(rank)
        copies[rank].append(expert_id)
    return ExpertPlacement(
        base.num_experts, base.primary, tuple(tuple(sorted(ids)) for ids in copies)
    )


def max_mean_load_ratio(rank_load: Sequence[float]) -> float:
    """The busiest rank's load over the mean rank load (1.0: balanced; 0.0: no load)."""
    mean = sum(rank_load) / len(rank_load) if rank_load else 0.0
    return max(rank_load) / mean if mean > 0 else 0.0


def _next_copy(
    tokens_per_expert: Sequence[int], holders: dict[int, list[int]], load: list[float]
) -> tuple[int, int] | None:
    """(expert, rank) of the next copy: the hottest expert per holder whose least-loaded
    non-holder rank, with the copy's share, stays below the expert's busiest holder; ties go
    to the lower id. None when no expert has one."""
    by_heat = sorted(holders, key=lambda e: (-tokens_per_expert[e] / len(holders[e]), e))
    for expert_id in by_heat:
        if tokens_per_expert[expert_id] == 0:
            return None  # the rest are cold too
        busiest = max(load[r] for r in holders[expert_id])
        candidates = [r for r in range(len(load)) if r not in holders[expert_id]]
        if candidates:
            rank = min(candidates, key=lambda r: (load[r], r))
            share = tokens_per_expert[expert_id] / (len(holders[expert_id]) + 1)
            if load[rank] + share < busiest:
                return expert_id, rank
    return None


def _check_inputs(base: ExpertPlacement, tokens_per_expert: Sequence[int], num_copies: int) -> None:
    if len(tokens_per_expert) != base.num_experts:
        raise ConfigError(
            f"tokens_per_expert has {len(tokens_per_expert)} experts, the plan {base.num_experts}",
            param="tokens_per_expert",
        )
    if any(tokens < 0 for tokens in tokens_per_expert):
        raise ConfigError(
            f"tokens_per_expert must be >= 0, got {list(tokens_per_expert)}",
            param="tokens_per_expert",
        )
    check_copy_budget(base, num_copies)


def check_copy_budget(base: ExpertPlacement, num_copies: int) -> None:
    """Raise :class:`ConfigError` (``eplb.redundant_experts``) unless ``num_copies`` copies fit
    the gang: each rank holds an expert at most once."""
    capacity = base.num_experts * (base.num_ranks - 1)
    if not 0 <= num_copies <= capacity:
        raise ConfigError(
            f"eplb.redundant_experts must be in 0..{capacity} for {base.num_experts} experts on "
            f"{base.num_ranks} ranks (each rank holds an expert at most once), got {num_copies}",
            param="eplb.redundant_experts",
        )
