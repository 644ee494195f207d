"""The gang's check that every rank uses the same expert placement (by fingerprint)."""

from __future__ import annotations

from core.errors import ConfigError
from engine.expert_parallel.collective import EPCollective
from engine.expert_parallel.placement import ExpertPlacement


def check_placement_agreement(collective: EPCollective, placement: ExpertPlacement) -> None:
    """Raise :class:`ConfigError` on every rank unless all ranks hold the same placement."""
    fingerprint = placement.fingerprint()
    highest, negated_lowest = collective.all_reduce_max([fingerprint, -fingerprint])
    if highest != fingerprint or -negated_lowest != fingerprint:
        raise ConfigError(
            f"expert-parallel rank {collective.rank}: the gang's ranks use different expert "
            "placements",
            param="placement",
        )
