"""Adaptive draft length: each request drafts as many tokens as its recent verifications earn.

After a verification that rejected a draft, the request next drafts one more token than it had
accepted (a request whose guesses keep failing drafts one token, costing a verify row of two);
after one that accepted every draft, it drafts one more than before, up to
``num_speculative_tokens``. A new request starts at the maximum.
"""

from __future__ import annotations


class DraftLengths:
    """Per-request draft lengths, following each request's measured acceptance."""

    def __init__(self, max_num_tokens: int, *, adaptive: bool) -> None:
        self.max_num_tokens = max_num_tokens
        self.adaptive = adaptive
        self._lengths: dict[str, int] = {}

    def next(self, request_id: str) -> int:
        """How many tokens to draft for ``request_id`` now."""
        return self._lengths.get(request_id, self.max_num_tokens)

    def record(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        """A verification of ``num_drafted`` drafts kept the first ``num_accepted``."""
        if not self.adaptive or num_drafted <= 0:
            return
        rejected = num_accepted < num_drafted
        length = num_accepted + 1 if rejected else self.next(request_id) + 1
        self._lengths[request_id] = max(1, min(length, self.max_num_tokens))

    def forget(self, request_id: str) -> None:
        """The request ended."""
        self._lengths.pop(request_id, None)
