"""Step plans: exact tokens, positions and block tables; chunked prefill; budgets; admission."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import InvalidRequestError
from core.sampling import SamplingParams
from engine.request import FinishReason, Request, RequestStatus


def summary(output: Any) -> list[tuple[str, int, int, bool]]:
    """(request id, start position, number of new tokens, samples) per scheduled request."""
    return [
        (s.request_id, s.start_position, s.num_new_tokens, s.samples_token)
        for s in output.scheduled
    ]


def test_single_request_prefill_then_decode(make_harness: Any, reference: Any) -> None:
    h = make_harness()
    prompt = list(range(1, 11))
    h.add("a", prompt, max_tokens=3)
    first = h.step()
    [item] = first.scheduled
    assert item.token_ids == prompt
    assert item.start_position == 0
    assert item.block_ids == [1, 2, 3]
    assert item.samples_token
    assert item.num_output_tokens == 0
    second = h.step()
    [item] = second.scheduled
    assert item.token_ids == [h.outputs["a"][0]]
    assert (item.start_position, item.block_ids, item.num_output_tokens) == (10, [1, 2, 3], 1)
    h.run()
    assert h.outputs["a"] == reference(prompt, 3)
    assert h.reasons["a"] is FinishReason.LENGTH
    assert h.plans[-1].finished_request_ids == [] and not h.scheduler.has_unfinished()
    assert h.scheduler.schedule().finished_request_ids == ["a"]
    h.assert_pool_whole()


def test_long_prompt_is_chunked_exactly_by_the_budget(make_harness: Any, reference: Any) -> None:
    h = make_harness(budget=16)
    prompt = [(7 * i) % 41 + 1 for i in range(40)]
    h.add("long", prompt, max_tokens=4)
    assert [summary(h.step()) for _ in range(3)] == [
        [("long", 0, 16, False)],
        [("long", 16, 16, False)],
        [("long", 32, 8, True)],
    ]
    assert h.plans[0].scheduled[0].block_ids == [1, 2, 3, 4]
    assert h.plans[2].scheduled[0].block_ids == list(range(1, 11))
    h.run()
    assert h.outputs["long"] == reference(prompt, 4)
    h.assert_pool_whole()


def test_long_prefill_threshold_leaves_budget_to_a_short_prompt(
    make_harness: Any, reference: Any
) -> None:
    h = make_harness(budget=16, long_prefill=10)
    long_prompt = [(5 * i) % 37 + 1 for i in range(30)]
    h.add("long", long_prompt, max_tokens=2)
    assert summary(h.step()) == [("long", 0, 10, False)]
    h.add("short", [3, 4, 5, 6], max_tokens=2)  # arrives while the long prompt prefills
    assert summary(h.step()) == [("long", 10, 10, False), ("short", 0, 4, True)]
    assert summary(h.step()) == [("long", 20, 10, True), ("short", 4, 1, True)]
    h.run()
    assert h.outputs["long"] == reference(long_prompt, 2)
    assert h.outputs["short"] == reference([3, 4, 5, 6], 2)
    h.assert_pool_whole()


def test_without_the_threshold_a_long_prompt_takes_the_budget(make_harness: Any) -> None:
    h = make_harness(budget=16)
    h.add("long", [(5 * i) % 37 + 1 for i in range(40)], max_tokens=2)
    h.step()
    h.add("short", [3, 4, 5, 6], max_tokens=2)
    assert summary(h.step()) == [("long", 16, 16, False)]  # the short prompt waits


def test_running_decodes_come_before_a_new_prompt_chunk(make_harness: Any) -> None:
    h = make_harness(budget=16)
    h.add("a", [1, 2, 3], max_tokens=10)
    h.add("b", [4, 5, 6], max_tokens=10)
    h.step()  # both prefilled in one step
    h.add("long", list(range(1, 41)), max_tokens=2)
    assert summary(h.step()) == [("a", 3, 1, True), ("b", 3, 1, True), ("long", 0, 14, False)]
    # the long prompt, now running, leaves room for the two decodes behind it
    assert summary(h.step()) == [("a", 4, 1, True), ("b", 4, 1, True), ("long", 14, 14, False)]


def test_a_running_chunk_reserves_budget_for_later_decodes(make_harness: Any) -> None:
    h = make_harness(budget=16)
    h.add("long", list(range(1, 41)), max_tokens=2)
    h.step()  # long: 16 of 40
    h.add("a", [1, 2, 3], max_tokens=10)
    assert summary(h.step()) == [("long", 16, 16, False)]  # waiting "a" gets no budget
    assert summary(h.step()) == [("long", 32, 8, True), ("a", 0, 3, True)]
    assert summary(h.step()) == [("long", 40, 1, True), ("a", 3, 1, True)]


def test_max_num_seqs_limits_running_requests(make_harness: Any, reference: Any) -> None:
    h = make_harness(max_num_seqs=2, budget=64)
    prompts = {rid: [i + 1, i + 2, i + 3] for i, rid in enumerate("abc")}
    for rid, prompt in prompts.items():
        h.add(rid, prompt, max_tokens=2)
    assert [s.request_id for s in h.step().scheduled] == ["a", "b"]
    assert h.scheduler.stats().num_waiting == 1
    h.run()
    for rid, prompt in prompts.items():
        assert h.outputs[rid] == reference(prompt, 2)
    h.assert_pool_whole()


def test_admission_waits_for_the_blocks_of_the_next_chunk(
    make_harness: Any, reference: Any
) -> None:
    h = make_harness(num_blocks=6, budget=32)  # 5 usable blocks of 4 tokens
    h.add("a", list(range(1, 13)), max_tokens=2)  # 12 tokens: 3 blocks, then 4 for decode
    h.add("b", list(range(20, 28)), max_tokens=2)  # needs 2 blocks: only 2 left, fits
    h.add("c", list(range(30, 34)), max_tokens=2)  # needs 1 block: none left, waits
    assert [s.request_id for s in h.step().scheduled] == ["a", "b"]
    stats = h.scheduler.stats()
    assert (stats.num_running, stats.num_waiting, stats.num_free_blocks) == (2, 1, 0)
    h.run()
    assert h.outputs["c"] == reference(list(range(30, 34)), 2)
    h.assert_pool_whole()


def test_duplicate_and_empty_requests_are_rejected(make_harness: Any) -> None:
    h = make_harness()
    h.add("a", [1, 2])
    with pytest.raises(InvalidRequestError, match="already in use"):
        h.add("a", [3])
    with pytest.raises(InvalidRequestError, match="empty") as info:
        h.add("b", [])
    assert info.value.param == "prompt"


def test_update_skips_requests_aborted_after_schedule(make_harness: Any) -> None:
    h = make_harness()
    h.add("a", [1, 2, 3])
    h.add("b", [4, 5, 6])
    output = h.scheduler.schedule()
    sampled = h.runner.execute(output)
    assert h.scheduler.abort("a")
    updates = h.scheduler.update_from_output(output, sampled)
    assert [u.request_id for u in updates] == ["b"]
    assert updates[0].status is RequestStatus.RUNNING
    h.scheduler.check_integrity()
    assert h.scheduler.schedule().finished_request_ids == ["a"]


def test_a_missing_sampled_token_is_a_clear_error(make_harness: Any) -> None:
    h = make_harness()
    h.add("a", [1, 2, 3])
    output = h.scheduler.schedule()
    with pytest.raises(ValueError, match="no sampled token for request a"):
        h.scheduler.update_from_output(output, {})


def test_an_earlier_request_recomputing_leaves_budget_for_later_decodes(
    make_harness: Any, reference: Any
) -> None:
    """A failed import recomputes its prompt in chunks while a later request decodes."""
    h = make_harness(budget=16)
    prompt = [(3 * i) % 37 + 1 for i in range(40)]
    first = reference(prompt, 1)[0]
    h.scheduler.add_import_request(Request("x", prompt, SamplingParams(max_tokens=3)), first)
    h.add("a", [1, 2, 3], max_tokens=10)
    h.step()
    assert h.scheduler.mark_kv_failed("x", recompute=True)
    h.outputs["x"] = [first]
    assert summary(h.step()) == [("a", 3, 1, True), ("x", 0, 15, False)]
    # "x" arrived first, so it now runs first, but keeps one token for "a"
    assert summary(h.step()) == [("x", 15, 15, False), ("a", 4, 1, True)]
    h.run()
    assert h.outputs["x"] == reference(prompt, 3)
    h.assert_pool_whole()
