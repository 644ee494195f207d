"""An offline acceptance simulator: how many tokens a draft method would save, without a model.

Each case's reference answer plays the target model under greedy decoding: every step the
proposer drafts up to ``num_speculative_tokens`` tokens after what has been emitted so far, the
drafted tokens that agree with the reference are accepted, and the step emits them plus one
token of its own (the target's token after the last accepted one), as a verifying forward does.
Cases run one after the other through one proposer, and each is finished before the next, so
a method with a cache of earlier outputs is measured with it.

This compares proposers on the same data (``benchmarks/spec_workloads.py``); what acceptance
buys in time is the engine benchmark's to measure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from benchmarks.spec_workloads import TokenCase
from engine.spec_decode.proposer import Proposer


@dataclass(frozen=True)
class AcceptanceStats:
    """What a replay counted, in the terms of vLLM's speculative-decoding metrics."""

    num_steps: int  # verifying forwards
    num_output_tokens: int
    num_drafts: int  # steps that verified at least one drafted token
    num_draft_tokens: int
    num_accepted_tokens: int

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a drafting step emits on average: 1 + accepted drafted tokens per draft
        (vLLM's definition; 1.0 when nothing was drafted)."""
        if self.num_drafts == 0:
            return 1.0
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    @property
    def tokens_per_step(self) -> float:
        """Output tokens per verifying forward, steps without a draft included."""
        return self.num_output_tokens / self.num_steps if self.num_steps else 0.0


def simulate_acceptance(
    proposer: Proposer, cases: Sequence[TokenCase], num_speculative_tokens: int
) -> AcceptanceStats:
    """Replay every case's reference through ``proposer`` (in order, one request each)."""
    if num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be at least 1, got {num_speculative_tokens}")
    replays = [
        _replay(proposer, f"{index}-{case.name}", case, num_speculative_tokens)
        for index, case in enumerate(cases)
    ]
    return AcceptanceStats(
        num_steps=sum(replay.num_steps for replay in replays),
        num_output_tokens=sum(replay.num_output_tokens for replay in replays),
        num_drafts=sum(replay.num_drafts for replay in replays),
        num_draft_tokens=sum(replay.num_draft_tokens for replay in replays),
        num_accepted_tokens=sum(replay.num_accepted_tokens for replay in replays),
    )


def compare_methods(
    methods: Mapping[str, Callable[[], Proposer]],
    cases: Sequence[TokenCase],
    num_speculative_tokens: int,
) -> dict[str, AcceptanceStats]:
    """Each method (a fresh proposer from its factory) over the same cases."""
    return {
        name: simulate_acceptance(make(), cases, num_speculative_tokens)
        for name, make in methods.items()
    }


def _replay(
    proposer: Proposer, request_id: str, case: TokenCase, num_speculative_tokens: int
) -> AcceptanceStats:
    """One request's replay."""
    prompt = case.prompt_token_ids
    reference = case.reference_token_ids
    token_ids = list(prompt)
    num_steps = num_drafts = num_draft_tokens = num_accepted_tokens = 0
    emitted = 0
    while emitted < len(reference):
        # The step's own token always comes from the target: never draft past the answer.
        room = min(num_speculative_tokens, len(reference) - emitted - 1)
        draft = proposer.propose(request_id, token_ids, len(prompt), room)[:room] if room else []
        accepted = 0
        while accepted < len(draft) and draft[accepted] == reference[emitted + accepted]:
            accepted += 1
        token_ids.extend(reference[emitted : emitted + accepted + 1])
        emitted += accepted + 1
        num_steps += 1
        num_drafts += 1 if draft else 0
        num_draft_tokens += len(draft)
        num_accepted_tokens += accepted
    proposer.finish(request_id)
    return AcceptanceStats(
        num_steps=num_steps,
        num_output_tokens=len(reference),
        num_drafts=num_drafts,
        num_draft_tokens=num_draft_tokens,
        num_accepted_tokens=num_accepted_tokens,
    )
