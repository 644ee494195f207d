"""How hot each prompt prefix is, as the router places requests: decayed rates, bounded memory.

A prefix is named by its **head**: the chained block hash of a prompt's first ``head_blocks``
blocks (:func:`prefix_head`; the chained hash names every block before it too, so equal heads
mean equal leading blocks, exactly as the KV index matches them). Per head, :class:`PrefixHeat`
keeps

- an exponentially decayed request count and token count (half-life ``heat_half_life_s``),
  read as rates: a decayed count over the decay's time constant is requests (tokens) per
  second over the last few half-lives. A head seen for less than a few half-lives would read
  low (its count has not built up), so the count is divided by the weight its age can hold,
  ``1 - exp(-age / time constant)`` (bias correction; the age counted as at least a tenth of
  a half-life, so a head's first request reads about one request per that time, not infinity);
- the tokens of its requests placed and not finished (queued tokens), given back by
  :meth:`PrefixHeat.finish`.

Memory is bounded by a **top-K table**: at most ``max_tracked_prefixes`` heads; a new head
arriving at a full table evicts the coldest one (lowest decayed request count, an O(K) scan
only when a head is new). A prefix that stays hot keeps its place; a one-off prompt is the
first to go. The requests in flight are bounded the same way (the oldest dropped first).
Decay is lazy: an entry is brought up to date only when it is read or written.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from core.hashing import BlockHash


def prefix_head(block_hashes: Sequence[BlockHash], head_blocks: int) -> BlockHash | None:
    """The hash naming the prompt's first ``head_blocks`` blocks (all of them when shorter);
    ``None`` for a prompt without a full block."""
    if not block_hashes:
        return None
    return block_hashes[min(head_blocks, len(block_hashes)) - 1]


@dataclass(frozen=True)
class HeatReading:
    """One prefix's heat now."""

    head: BlockHash
    rate_per_s: float  # decayed requests per second
    tokens_per_s: float  # decayed prompt tokens per second
    num_queued_tokens: int  # tokens of its requests placed and not finished


@dataclass
class _Entry:
    num_requests: float  # decayed count at ``updated_s``
    num_tokens: float
    num_queued_tokens: int
    updated_s: float
    first_s: float


class PrefixHeat:
    """Decayed request and token rates, and queued tokens, per prefix head (top-K bounded)."""

    def __init__(
        self, *, half_life_s: float, max_prefixes: int, max_in_flight: int = 100_000
    ) -> None:
        if half_life_s <= 0 or max_prefixes < 1:
            raise ValueError("PrefixHeat needs half_life_s > 0 and max_prefixes >= 1")
        self._decay_per_s = math.log(2.0) / half_life_s  # 1 / the decay's time constant
        self._min_age_s = half_life_s / 10.0
        self.max_prefixes = max_prefixes
        self.max_in_flight = max_in_flight
        self._entries: dict[BlockHash, _Entry] = {}
        self._in_flight: OrderedDict[str, tuple[BlockHash, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, request_id: str, head: BlockHash, num_tokens: int, now_s: float) -> None:
        """One request of prefix ``head`` with ``num_tokens`` prompt tokens was placed."""
        entry = self._entries.get(head)
        if entry is None:
            if len(self._entries) >= self.max_prefixes:
                self._evict_coldest(now_s)
            entry = self._entries[head] = _Entry(0.0, 0.0, 0, now_s, now_s)
        self._decay(entry, now_s)
        entry.num_requests += 1.0
        entry.num_tokens += num_tokens
        entry.num_queued_tokens += num_tokens
        self.finish(request_id)  # a retried placement is counted once in the queue
        self._in_flight[request_id] = (head, num_tokens)
        while len(self._in_flight) > self.max_in_flight:
            self.finish(next(iter(self._in_flight)))

    def finish(self, request_id: str) -> None:
        """The request ended: its tokens leave its prefix's queue."""
        placed = self._in_flight.pop(request_id, None)
        if placed is None:
            return
        entry = self._entries.get(placed[0])
        if entry is not None:
            entry.num_queued_tokens = max(0, entry.num_queued_tokens - placed[1])

    def reading(self, head: BlockHash, now_s: float) -> HeatReading:
        """``head``'s heat now (all zero for a prefix not tracked)."""
        entry = self._entries.get(head)
        if entry is None:
            return HeatReading(head, 0.0, 0.0, 0)
        self._decay(entry, now_s)
        age_s = max(now_s - entry.first_s, self._min_age_s)
        per_s = self._decay_per_s / -math.expm1(-self._decay_per_s * age_s)
        return HeatReading(
            head,
            rate_per_s=entry.num_requests * per_s,
            tokens_per_s=entry.num_tokens * per_s,
            num_queued_tokens=entry.num_queued_tokens,
        )

    def hottest(self, now_s: float, limit: int) -> list[HeatReading]:
        """The ``limit`` hottest prefixes by request rate, hottest first."""
        readings = [self.reading(head, now_s) for head in list(self._entries)]
        readings.sort(key=lambda r: -r.rate_per_s)
        return readings[:limit]

    def _decay(self, entry: _Entry, now_s: float) -> None:
        elapsed_s = now_s - entry.updated_s
        if elapsed_s > 0.0:
            factor = math.exp(-self._decay_per_s * elapsed_s)
            entry.num_requests *= factor
            entry.num_tokens *= factor
            entry.updated_s = now_s

    def _evict_coldest(self, now_s: float) -> None:
        for entry in self._entries.values():
            self._decay(entry, now_s)
        coldest = min(self._entries, key=lambda head: self._entries[head].num_requests)
        del self._entries[coldest]
