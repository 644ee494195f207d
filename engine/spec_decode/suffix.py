"""Suffix decoding: drafts from what the request itself and recently finished requests said.

Each running request has its own suffix tree over its prompt and output, grown by the tokens
accepted since the last step (never rebuilt). Finished requests leave their outputs in one
shared tree, which keeps the ``max_cached_requests`` most recent and drops the oldest. A step's
draft is the better-scoring of the two trees' drafts (the score is the expected number of
accepted tokens), so a request whose answer repeats its prompt drafts from its own tree and one
whose answer repeats an earlier answer drafts from the shared one.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from core.errors import ConfigError
from engine.spec_decode.suffix_tree import NO_DRAFT, SuffixTree

logger = logging.getLogger(__name__)

_OWN = "own"  # the one sequence of a request's own tree


@dataclass
class _RequestTree:
    """A running request's tree and where its prompt ends."""

    tree: SuffixTree
    num_prompt_tokens: int


class SuffixProposer:
    """The ``Proposer`` of suffix decoding (per-request trees plus a cache of finished outputs)."""

    def __init__(
        self,
        max_tree_depth: int,
        max_cached_requests: int,
        max_spec_factor: float,
        min_token_prob: float,
    ) -> None:
        if max_tree_depth < 2:
            raise ConfigError(f"suffix max_tree_depth must be at least 2, got {max_tree_depth}")
        if max_cached_requests < 0:
            raise ConfigError(
                f"suffix max_cached_requests must not be negative, got {max_cached_requests}"
            )
        if max_spec_factor <= 0:
            raise ConfigError(f"suffix max_spec_factor must be positive, got {max_spec_factor}")
        if not 0.0 <= min_token_prob <= 1.0:
            raise ConfigError(f"suffix min_token_prob must be in [0, 1], got {min_token_prob}")
        self.max_tree_depth = max_tree_depth
        self.max_cached_requests = max_cached_requests
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self._requests: dict[str, _RequestTree] = {}
        self._cache = SuffixTree(max_tree_depth)
        self._cached_ids: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._next_cache_id = itertools.count()

    @property
    def num_cached_requests(self) -> int:
        """How many finished outputs the shared tree holds."""
        return len(self._cached_ids)

    @property
    def num_running_requests(self) -> int:
        """How many requests have a tree of their own."""
        return len(self._requests)

    @property
    def cache_tree(self) -> SuffixTree:
        """The shared tree of finished outputs (read it, never change it)."""
        return self._cache

    def propose(
        self,
        request_id: str,
        token_ids: Sequence[int],
        num_prompt_tokens: int,
        max_num_tokens: int,
    ) -> list[int]:
        """Up to ``max_num_tokens`` drafted tokens after ``token_ids`` (see ``Proposer``)."""
        if max_num_tokens <= 0 or not token_ids:
            return []
        tree = self._own_tree(request_id, token_ids, num_prompt_tokens)
        best = NO_DRAFT
        for source in (tree, self._cache):
            draft = source.draft(
                token_ids, max_num_tokens, self.max_spec_factor, self.min_token_prob
            )
            if draft.score > best.score:
                best = draft
        return list(best.token_ids)

    def finish(self, request_id: str) -> None:
        """Free the request's tree; its output joins the cache. Idempotent."""
        request = self._requests.pop(request_id, None)
        if request is None or self.max_cached_requests == 0:
            return
        output = request.tree.token_ids(_OWN)[request.num_prompt_tokens :]
        if not output:
            return
        cache_id = next(self._next_cache_id)
        self._cache.extend(cache_id, output)
        self._cache.seal(cache_id)
        self._cached_ids[cache_id] = None
        while len(self._cached_ids) > self.max_cached_requests:
            oldest, _ = self._cached_ids.popitem(last=False)
            self._cache.remove(oldest)

    def _own_tree(
        self, request_id: str, token_ids: Sequence[int], num_prompt_tokens: int
    ) -> SuffixTree:
        """The request's tree, grown to ``token_ids`` (started again after a preemption)."""
        request = self._requests.get(request_id)
        if request is not None and not _continues(request, token_ids, num_prompt_tokens):
            logger.debug("request %s: tokens restarted, suffix tree rebuilt", request_id)
            request = None
        if request is None:
            request = _RequestTree(SuffixTree(self.max_tree_depth), num_prompt_tokens)
            self._requests[request_id] = request
        known = request.tree.num_tokens(_OWN)
        request.tree.extend(_OWN, token_ids[known:])
        return request.tree


def _continues(request: _RequestTree, token_ids: Sequence[int], num_prompt_tokens: int) -> bool:
    """Whether ``token_ids`` extends what the request's tree holds (a cheap check: the prompt
    length and the last known token; a preemption shrinks the tokens back to the prompt)."""
    held = request.tree.token_ids(_OWN)
    return (
        num_prompt_tokens == request.num_prompt_tokens
        and len(token_ids) >= len(held)
        and (not held or token_ids[len(held) - 1] == held[-1])
    )
