"""Recorded prompt chunks: a decode that recomputes a prompt chunks it as its prefill did."""

from __future__ import annotations

from typing import Any

from core.sampling import SamplingParams
from engine.request import Request

PROMPT = list(range(1, 23))  # 22 tokens: 5 full blocks of 4 + 2


def prefilled(make_harness: Any, prompt: list[int], budget: int) -> tuple[int, tuple[int, ...]]:
    p = make_harness(budget=budget)
    p.add("x", prompt, max_tokens=6, prefill_only=True)
    p.run()
    pinned = p.scheduler.get_pinned_blocks("x")
    assert pinned is not None
    return p.outputs["x"][0], pinned.prompt_chunk_ends


def recompute(d: Any, first: int, ends: tuple[int, ...]) -> Request:
    request = Request("x", PROMPT, SamplingParams(max_tokens=6), eos_token_ids=(0,))
    request.follow_chunk_ends = ends
    d.scheduler.add_import_request(request, first)
    assert d.scheduler.mark_kv_failed("x", recompute=True)
    d.outputs["x"] = [first]
    return request


def chunk_sizes(plans: list[Any], request_id: str) -> list[int]:
    return [
        i.num_new_tokens for plan in plans for i in plan.scheduled if i.request_id == request_id
    ]


def test_prefill_records_where_its_chunks_ended(make_harness: Any) -> None:
    assert prefilled(make_harness, PROMPT, budget=8)[1] == (8, 16, 22)
    assert prefilled(make_harness, PROMPT, budget=16)[1] == (16, 22)


def test_a_prefix_hit_counts_as_a_boundary(make_harness: Any) -> None:
    p = make_harness(budget=8)
    p.add("warm", [*PROMPT[:12], 90, 91], max_tokens=1)
    p.run()
    p.add("x", PROMPT, max_tokens=6, prefill_only=True)
    p.run()
    pinned = p.scheduler.get_pinned_blocks("x")
    assert pinned is not None and pinned.prompt_chunk_ends == (12, 20, 22)


def test_recompute_follows_the_recorded_chunks_not_its_own_budget(
    make_harness: Any, reference: Any
) -> None:
    first, ends = prefilled(make_harness, PROMPT, budget=8)
    d = make_harness(budget=16)
    recompute(d, first, ends)
    d.run()
    assert d.outputs["x"] == reference(PROMPT, 6)
    # 8 + 8 + 6 prompt tokens as on the prefill, then the first token as a decode step.
    assert chunk_sizes(d.plans, "x")[:4] == [8, 8, 6, 1]
    d.assert_pool_whole()


def test_without_a_recorded_plan_the_budget_decides(make_harness: Any) -> None:
    first, _ = prefilled(make_harness, PROMPT, budget=8)
    d = make_harness(budget=16)
    recompute(d, first, ())
    d.run()
    assert chunk_sizes(d.plans, "x")[:2] == [16, 7]


def test_a_local_prefix_hit_is_trimmed_to_a_recorded_boundary(
    make_harness: Any, reference: Any
) -> None:
    first, ends = prefilled(make_harness, PROMPT, budget=8)  # (8, 16, 22)
    d = make_harness(budget=16)
    d.add("warm", [*PROMPT[:20], 90], max_tokens=1)  # caches 5 blocks = 20 tokens
    d.run()
    recompute(d, first, ends)
    d.run()
    starts = [i.start_position for plan in d.plans for i in plan.scheduled if i.request_id == "x"]
    assert starts[0] == 16  # the 20-token hit trimmed back to the boundary at 16
    assert chunk_sizes(d.plans, "x")[:2] == [6, 1]
    assert d.outputs["x"] == reference(PROMPT, 6)
    d.assert_pool_whole()


def test_a_recorded_chunk_that_does_not_fit_overshoots_once_per_step(
    make_harness: Any, reference: Any
) -> None:
    first, ends = prefilled(make_harness, PROMPT, budget=8)  # (8, 16, 22)
    d = make_harness(budget=8)
    d.add("busy", [50, 51, 52], max_tokens=20)
    d.step()  # "busy" decodes from now on: 7 tokens of room per step
    recompute(d, first, ends)
    plan = d.scheduler.schedule()
    sizes = {i.request_id: i.num_new_tokens for i in plan.scheduled}
    assert sizes == {"busy": 1, "x": 8}  # the whole recorded chunk, 1 token over the budget
    assert plan.num_scheduled_tokens == 9
    d.scheduler.update_from_output(plan, d.runner.execute(plan))
    d.scheduler.check_integrity()
    for _ in range(200):
        if not d.scheduler.has_unfinished():
            break
        plan = d.scheduler.schedule()
        assert plan.num_scheduled_tokens <= 2 * d.scheduler.max_num_batched_tokens
        for update in d.scheduler.update_from_output(plan, d.runner.execute(plan)):
            d.outputs.setdefault(update.request_id, []).extend(update.new_token_ids)
    assert d.outputs["x"] == reference(PROMPT, 6)
    d.assert_pool_whole()
