"""N-gram prompt lookup: draft the tokens that followed an earlier occurrence of the suffix.

For each request an index maps every n-gram (``prompt_lookup_min`` <= n <=
``prompt_lookup_max``) of its tokens to where its first occurrence ended. The index grows with
the sequence — each new token adds at most one n-gram per length — so a step costs
``O(lengths + k)`` per request, never a scan of the whole context. A proposal tries the longest
suffix first; the drafts are the tokens that followed that suffix's first earlier occurrence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from core.config import SpeculativeConfig


@dataclass
class _NgramIndex:
    """One request's n-grams: ``ends[n][gram]`` is where ``gram`` first ended (exclusive)."""

    ends: dict[int, dict[tuple[int, ...], int]]
    num_indexed: int = 0
    """N-grams ending at positions up to here are indexed; the one ending at the sequence's
    end is left out (it is the suffix being looked up, not an earlier occurrence)."""
    tokens: list[int] = field(default_factory=list)

    def extend(self, token_ids: Sequence[int]) -> None:
        """Index the n-grams ending before ``len(token_ids)`` (not at it)."""
        self.tokens.extend(token_ids[len(self.tokens) :])
        stop = len(self.tokens) - 1
        for end in range(self.num_indexed + 1, stop + 1):
            for n, grams in self.ends.items():
                if end >= n:
                    grams.setdefault(tuple(self.tokens[end - n : end]), end)
        self.num_indexed = max(self.num_indexed, stop)


class NgramProposer:
    """Prompt lookup over each request's own prompt and output (vLLM's ``ngram`` method)."""

    def __init__(self, config: SpeculativeConfig) -> None:
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max
        self._indexes: dict[str, _NgramIndex] = {}

    def propose(
        self,
        request_id: str,
        token_ids: Sequence[int],
        num_prompt_tokens: int,
        max_num_tokens: int,
    ) -> list[int]:
        """The tokens after the first earlier occurrence of the longest matching suffix."""
        del num_prompt_tokens  # prompt and output are searched alike
        index = self._indexes.get(request_id)
        if index is None or len(token_ids) < len(index.tokens):
            index = _NgramIndex({n: {} for n in range(self.min_n, self.max_n + 1)})
            self._indexes[request_id] = index
        index.extend(token_ids)
        tokens = index.tokens
        length = len(tokens)
        if max_num_tokens <= 0:
            return []
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            end = index.ends[n].get(tuple(tokens[length - n :]))
            if end is not None:
                return tokens[end : min(end + max_num_tokens, length)]
        return []

    def finish(self, request_id: str) -> None:
        """Drop the request's index."""
        self._indexes.pop(request_id, None)
