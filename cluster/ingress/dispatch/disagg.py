"""Conditional disaggregation: prefill remotely on the prefill pool, or locally on decode.

A prompt whose *uncached* part is shorter than ``local_prefill_threshold_tokens`` costs less to
prefill on the decode replica than to ship its KV; so does any request when no prefill replica
is healthy. The part already cached on decode comes from an optional ``cached_blocks_fn`` (the
scheduler's KV index plugs in here; without it nothing counts as cached). It counts blocks in a
decode replica's host and disk tiers too: loading them back costs a small fraction of
recomputing them, so turn N+1 of a conversation whose KV was offloaded on decode prefills only
its new tokens there. Every decision carries a reason, which the ingress counts.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.hashing import BlockHash

CachedBlocksFn = Callable[[Sequence[BlockHash]], int]
"""Prompt block hashes -> how many leading blocks the decode pool already caches."""


class DisaggReason(enum.StrEnum):
    """Why a request prefilled where it did."""

    LONG_PROMPT = "long_prompt"
    """Remote: the uncached part is at least the threshold."""
    SHORT_PROMPT = "short_prompt"
    """Local: the whole prompt is under the threshold."""
    CACHED_PREFIX = "cached_prefix"
    """Local: the prompt is long but its uncached part is under the threshold."""
    NO_PREFILL_CAPACITY = "no_prefill_capacity"
    """Local: no prefill replica is healthy."""
    PREFILL_FAILED = "prefill_failed"
    """Local: the remote prefill failed and the request fell back to decode."""


@dataclass(frozen=True)
class DisaggDecision:
    """Where one request prefills, and why."""

    remote: bool
    reason: DisaggReason
    num_uncached_tokens: int

    @property
    def label(self) -> str:
        """``remote`` or ``local`` (the ``decision`` metric label)."""
        return "remote" if self.remote else "local"


class DisaggPolicy:
    """Decides remote vs local prefill from the prompt length, the cache and pool health."""

    def __init__(
        self,
        threshold_tokens: int,
        block_size: int,
        cached_blocks_fn: CachedBlocksFn | None = None,
    ) -> None:
        self._threshold_tokens = threshold_tokens
        self._block_size = block_size
        self._cached_blocks_fn = cached_blocks_fn

    def decide(
        self, num_prompt_tokens: int, block_hashes: Sequence[BlockHash], prefill_healthy: bool
    ) -> DisaggDecision:
        """The decision for one prompt."""
        num_cached_tokens = 0
        if self._cached_blocks_fn is not None and block_hashes:
            num_cached_blocks = min(self._cached_blocks_fn(block_hashes), len(block_hashes))
            num_cached_tokens = max(0, num_cached_blocks) * self._block_size
        num_uncached = num_prompt_tokens - num_cached_tokens
        if not prefill_healthy:
            return DisaggDecision(False, DisaggReason.NO_PREFILL_CAPACITY, num_uncached)
        if num_uncached < self._threshold_tokens:
            if num_prompt_tokens < self._threshold_tokens:
                return DisaggDecision(False, DisaggReason.SHORT_PROMPT, num_uncached)
            return DisaggDecision(False, DisaggReason.CACHED_PREFIX, num_uncached)
        return DisaggDecision(True, DisaggReason.LONG_PROMPT, num_uncached)

    @staticmethod
    def fallback(num_prompt_tokens: int) -> DisaggDecision:
        """The decision after a failed remote prefill: local on decode."""
        return DisaggDecision(False, DisaggReason.PREFILL_FAILED, num_prompt_tokens)
