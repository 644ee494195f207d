"""How fast this engine computes prompt tokens, measured on its own steps.

The router compares the cost of loading a block from a host or disk tier with the cost of
recomputing it; the second half of that ratio comes from here. Each step's wall time (forward
and sampling, which waits for the device) is split between its prompt tokens and its decode
tokens in proportion to their counts; the prompt share accumulates in
:attr:`PrefillRate.seconds_total`. A request's scheduled chunk counts as prompt work when it
computes more than one token (a decode step computes exactly one) and is not a verify row (a
decode's last token plus its speculative drafts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.scheduler.output import ScheduledRequest


@dataclass
class PrefillRate:
    """Monotonic prompt-token and prompt-second counters."""

    tokens_total: int = 0
    seconds_total: float = 0.0

    def record(self, scheduled: Sequence[ScheduledRequest], seconds: float) -> None:
        """Count one step that ran ``scheduled`` in ``seconds``."""
        num_prompt = sum(
            len(s.token_ids) for s in scheduled if len(s.token_ids) > 1 and not s.draft_token_ids
        )
        num_all = sum(len(s.token_ids) for s in scheduled)
        if num_prompt == 0 or num_all == 0 or seconds <= 0.0:
            return
        self.tokens_total += num_prompt
        self.seconds_total += seconds * num_prompt / num_all

    @property
    def seconds_per_token(self) -> float | None:
        """Mean prompt seconds per token so far (``None`` before the first prompt step)."""
        return self.seconds_total / self.tokens_total if self.tokens_total else None
