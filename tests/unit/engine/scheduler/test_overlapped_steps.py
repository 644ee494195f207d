"""The scheduler with overlapped steps: plans counted at once, sampled ids as placeholders."""

from __future__ import annotations

from typing import Any

from engine.request import FinishReason
from engine.scheduler.output import PENDING_TOKEN_ID


def test_the_next_plan_decodes_a_placeholder_before_the_token_is_known(
    make_harness: Any, reference: Any
) -> None:
    h = make_harness(overlap=True)
    request = h.add("a", [1, 2, 3, 4, 5], max_tokens=4)
    first = h.scheduler.schedule()
    assert [i.token_ids for i in first.scheduled] == [[1, 2, 3, 4, 5]]
    assert request.num_computed_tokens == 5 and request.num_output_placeholders == 1
    second = h.scheduler.schedule()  # before the first step's token is known
    (item,) = second.scheduled
    assert item.token_ids == [PENDING_TOKEN_ID]
    assert (item.start_position, item.samples_token, item.num_output_tokens) == (5, True, 1)
    assert request.num_output_placeholders == 2 and request.output_token_ids == []
    first_sampled = h.runner.execute(first)
    (update,) = h.scheduler.update_from_output(first, first_sampled)
    assert update.new_token_ids == reference([1, 2, 3, 4, 5], 1)
    assert request.output_token_ids == update.new_token_ids
    assert request.num_output_placeholders == 1
    h.scheduler.check_integrity()


def test_a_token_that_ends_by_length_is_not_planned_past(make_harness: Any) -> None:
    h = make_harness(overlap=True)
    h.add("one", [7, 8, 9], max_tokens=1)
    assert len(h.scheduler.schedule().scheduled) == 1
    assert h.scheduler.schedule().is_empty  # its one token is on the device: nothing to plan
    h.in_flight = None
    h.scheduler.abort("one")
    h.assert_pool_whole()


def test_finishing_in_flight_drops_the_extra_token(make_harness: Any, reference: Any) -> None:
    h = make_harness(overlap=True)
    h.add("eos", [4, 4, 4], max_tokens=10)
    h.step()  # the prefill queued
    h.runner.override["eos"] = 0  # the first decode samples EOS
    h.run()
    assert h.outputs["eos"] == [*reference([4, 4, 4], 1), 0]
    assert h.reasons["eos"] is FinishReason.STOP
    h.assert_pool_whole()
