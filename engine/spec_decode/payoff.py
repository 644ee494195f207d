"""Which requests draft next: those whose measured acceptance pays for their measured cost.

Each request's acceptance rate is a decayed ratio of drafts accepted to drafts verified (recent
verifications weigh most). With a :class:`~engine.spec_decode.step_costs.StepCostFit` of the
engine's own steps, a request drafts ``k`` tokens only while ``rate * k`` extra tokens per verify
row beat what that row costs at the current batch size (:meth:`StepCostFit.pays`); otherwise it
pauses, plain-decoding for a number of steps that doubles at each failed retry (reset once a
retry pays), and then drafts once more to measure again. Before the fit exists every request
drafts: the timings that make the fit come from those steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.spec_decode.step_costs import StepCostFit, StepCosts

_DECAY = 0.5
"""Weight of a request's older verifications against its newest."""
_FIRST_PAUSE_STEPS = 4
_MAX_PAUSE_STEPS = 256


@dataclass
class _Acceptance:
    """One request's decayed acceptance and its pause."""

    accepted: float = 0.0
    drafted: float = 0.0
    pause_steps: int = 0
    """Steps left before it drafts again (0: drafting)."""
    next_pause_steps: int = _FIRST_PAUSE_STEPS
    probing: bool = False
    """Drafting once after a pause, to measure again."""

    @property
    def rate(self) -> float | None:
        return None if self.drafted <= 0.0 else self.accepted / self.drafted


class DraftPayoff:
    """Per-request acceptance and the rule that pauses requests whose drafts do not pay."""

    def __init__(self, costs: StepCosts) -> None:
        self.costs = costs
        self._requests: dict[str, _Acceptance] = {}

    def record(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        """A verification of ``num_drafted`` drafts kept ``num_accepted``."""
        if num_drafted <= 0:
            return
        state = self._requests.setdefault(request_id, _Acceptance())
        state.accepted = _DECAY * state.accepted + num_accepted
        state.drafted = _DECAY * state.drafted + num_drafted

    def should_draft(self, request_id: str, num_rows: int, num_draft_tokens: int) -> bool:
        """Whether ``request_id`` drafts ``num_draft_tokens`` tokens for the next step of
        ``num_rows`` requests (called once per request and step)."""
        state = self._requests.setdefault(request_id, _Acceptance())
        if state.pause_steps > 0:
            state.pause_steps -= 1
            state.probing = state.pause_steps == 0
            return state.probing
        fit = self.costs.estimate()
        rate = state.rate
        if fit is None or rate is None or _pays(fit, rate, num_rows, num_draft_tokens):
            if state.probing:
                state.next_pause_steps = _FIRST_PAUSE_STEPS
            state.probing = False
            return True
        state.pause_steps = state.next_pause_steps
        state.next_pause_steps = min(2 * state.next_pause_steps, _MAX_PAUSE_STEPS)
        state.probing = False
        return False

    def is_paused(self, request_id: str) -> bool:
        """Whether ``request_id`` sits out drafting now."""
        state = self._requests.get(request_id)
        return state is not None and state.pause_steps > 0

    def forget(self, request_id: str) -> None:
        """The request ended (idempotent)."""
        self._requests.pop(request_id, None)


def _pays(fit: StepCostFit, rate: float, num_rows: int, num_draft_tokens: int) -> bool:
    return fit.pays(num_rows, num_draft_tokens, rate * num_draft_tokens)
