"""Never slower: the step-cost fit and the rule that pauses requests whose drafts do not pay.

Timings are injected (no clock is read): a step's seconds come from known coefficients.
"""

from __future__ import annotations

import pytest

from engine.spec_decode import DraftPayoff, StepCostFit, StepCosts

# a CPU-like step: 20 ms fixed, 2 ms per row, 1 ms per verify row, 1.5 ms per draft token
CPU = StepCostFit(base_s=0.020, per_row_s=0.002, per_verify_row_s=0.001, per_draft_s=0.0015)
# a GPU-like step: drafts nearly free
GPU = StepCostFit(base_s=0.010, per_row_s=0.0001, per_verify_row_s=0.0, per_draft_s=0.00001)


def _seconds(fit: StepCostFit, rows: int, verify_rows: int, drafts: int) -> float:
    return (
        fit.base_s
        + fit.per_row_s * rows
        + fit.per_verify_row_s * verify_rows
        + fit.per_draft_s * drafts
    )


def _fed(fit: StepCostFit, num_steps: int = 64) -> StepCosts:
    costs = StepCosts()
    for i in range(num_steps):
        rows = 1 + i % 32
        verify_rows = (i * 7) % (rows + 1)
        drafts = verify_rows * (1 + i % 4)
        costs.record(rows, verify_rows, drafts, _seconds(fit, rows, verify_rows, drafts))
    return costs


def test_the_fit_recovers_the_coefficients_of_its_steps() -> None:
    fit = _fed(CPU).estimate()
    assert fit is not None
    assert fit.base_s == pytest.approx(CPU.base_s, rel=1e-6)
    assert fit.per_row_s == pytest.approx(CPU.per_row_s, rel=1e-6)
    assert fit.per_verify_row_s == pytest.approx(CPU.per_verify_row_s, rel=1e-6)
    assert fit.per_draft_s == pytest.approx(CPU.per_draft_s, rel=1e-6)


def test_no_fit_before_enough_steps_or_without_variety_in_drafts() -> None:
    assert _fed(CPU, num_steps=8).estimate() is None
    costs = StepCosts()
    for _ in range(64):  # always the same drafts: their cost cannot be told apart
        costs.record(4, 4, 16, _seconds(CPU, 4, 4, 16))
    assert costs.estimate() is None
    costs.record(0, 0, 0, 1.0)  # an empty step is ignored
    assert costs.num_steps == 64


def test_break_even_follows_the_batch_size() -> None:
    # batch 1, 4 drafts: 7 ms extra against a 22 ms step: needs > 0.32 accepted tokens
    assert CPU.pays(1, 4, expected_accepted=0.4)
    assert not CPU.pays(1, 4, expected_accepted=0.3)
    # batch 32: 84 ms step of 32 tokens: 7 ms must bring > 2.7 tokens
    assert not CPU.pays(32, 4, expected_accepted=2.5)
    assert CPU.pays(32, 4, expected_accepted=2.8)
    # nearly free drafts pay with a fraction of a token accepted
    assert GPU.pays(32, 4, expected_accepted=0.2)


def _payoff(fit: StepCostFit | None) -> DraftPayoff:
    costs = StepCosts() if fit is None else _fed(fit)
    return DraftPayoff(costs)


def test_every_request_drafts_until_there_is_a_fit() -> None:
    payoff = _payoff(None)
    payoff.record("a", 4, 0)
    assert all(payoff.should_draft("a", 1, 4) for _ in range(10))


def test_a_request_whose_drafts_are_rejected_pauses_and_retries_later() -> None:
    payoff = _payoff(CPU)
    assert payoff.should_draft("a", 1, 4)  # nothing measured yet: it drafts
    payoff.record("a", 4, 0)
    decisions = [payoff.should_draft("a", 1, 4) for _ in range(5)]
    assert decisions == [False] * 4 + [True]  # paused four steps, then one probe
    payoff.record("a", 4, 0)  # the probe failed: the pause doubles
    decisions = [payoff.should_draft("a", 1, 4) for _ in range(9)]
    assert decisions == [False] * 8 + [True]
    for _ in range(4):  # the probe pays now (and keeps paying): drafting resumes
        payoff.record("a", 4, 4)
    assert all(payoff.should_draft("a", 1, 4) for _ in range(5))
    for _ in range(5):  # rejected again, long enough to outweigh the successes
        payoff.record("a", 4, 0)
    decisions = [payoff.should_draft("a", 1, 4) for _ in range(5)]
    assert decisions == [False] * 4 + [True]  # a success reset the pause


def test_the_same_acceptance_pays_alone_and_not_in_a_busy_batch() -> None:
    payoff = _payoff(CPU)
    payoff.record("a", 4, 2)  # half its drafts accepted
    assert payoff.should_draft("a", 1, 4)
    assert not payoff.should_draft("a", 32, 4)
    assert payoff.is_paused("a")
    assert not payoff.is_paused("b")
    payoff.forget("a")
    assert not payoff.is_paused("a")


def test_free_drafts_never_pause_a_request() -> None:
    payoff = _payoff(GPU)
    payoff.record("a", 4, 1)
    assert all(payoff.should_draft("a", 32, 4) for _ in range(10))
