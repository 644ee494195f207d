"""Speculative decoding counters: drafts verified and accepted, by position in the draft."""

from __future__ import annotations

from core.stats import SpecDecodeStats


class SpecDecodeCounters:
    """Running totals of the verify rows the scheduler applied; :meth:`snapshot` for stats."""

    def __init__(self) -> None:
        self.num_drafts = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.num_accepted_per_pos: list[int] = []

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One verify row of ``num_draft_tokens`` drafts, the first ``num_accepted`` kept."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        if len(self.num_accepted_per_pos) < num_draft_tokens:
            self.num_accepted_per_pos += [0] * (num_draft_tokens - len(self.num_accepted_per_pos))
        for position in range(num_accepted):
            self.num_accepted_per_pos[position] += 1

    def snapshot(self) -> SpecDecodeStats:
        """The totals now, frozen."""
        return SpecDecodeStats(
            num_drafts=self.num_drafts,
            num_draft_tokens=self.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens,
            num_accepted_tokens_per_pos=tuple(self.num_accepted_per_pos),
        )
