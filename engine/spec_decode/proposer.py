"""What every draft method answers: given a request's tokens so far, guess the next few.

A proposer is host-side and tensor-free for the draft-free methods (n-gram prompt lookup,
suffix decoding); the engine asks it once per step for each request that may speculate and
tells it when a request ends, so per-request state is freed and finished outputs can feed a
shared cache. The guesses are only proposals: the target model verifies them in its next step.
The engine asks through :class:`BatchProposer` (all of a step's requests at once, as a draft
model needs); :class:`EachRequest` adapts a per-request proposer to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Proposer(Protocol):
    """Drafts tokens for running requests; one per engine, called on the engine thread."""

    def propose(
        self,
        request_id: str,
        token_ids: Sequence[int],
        num_prompt_tokens: int,
        max_num_tokens: int,
    ) -> list[int]:
        """Up to ``max_num_tokens`` draft tokens to follow ``token_ids`` (the prompt's
        ``num_prompt_tokens`` tokens, then every accepted output token). ``token_ids`` only
        grows between calls for one request, except after a preemption, which starts it again
        from its prompt. An empty list: no guess worth verifying."""
        ...

    def finish(self, request_id: str) -> None:
        """The request ended (any reason): free its state. Idempotent; unknown ids are fine."""
        ...


@dataclass(frozen=True)
class DraftQuery:
    """One request to draft for in a batch: what :meth:`Proposer.propose` takes, as data."""

    request_id: str
    token_ids: Sequence[int]
    num_prompt_tokens: int
    max_num_tokens: int


class BatchProposer(Protocol):
    """Drafts for every speculating request of a step at once (a draft model runs them as one
    batch); what the engine calls."""

    def propose_batch(self, queries: Sequence[DraftQuery]) -> list[list[int]]:
        """Each query's drafts (see :meth:`Proposer.propose`), in query order."""
        ...

    def finish(self, request_id: str) -> None:
        """The request ended (any reason): free its state. Idempotent; unknown ids are fine."""
        ...


class EachRequest:
    """A per-request :class:`Proposer` as a :class:`BatchProposer` (the draft-free methods)."""

    def __init__(self, proposer: Proposer) -> None:
        self.proposer = proposer

    def propose_batch(self, queries: Sequence[DraftQuery]) -> list[list[int]]:
        """Ask the proposer once per query."""
        return [
            self.proposer.propose(q.request_id, q.token_ids, q.num_prompt_tokens, q.max_num_tokens)
            for q in queries
        ]

    def finish(self, request_id: str) -> None:
        """Pass it on."""
        self.proposer.finish(request_id)
