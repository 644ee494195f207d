"""Verify rows through the scheduler: drafts scheduled with the last token, progress rewound to
the accepted ones, rejected drafts never hashed, cached or announced.

The fake runner reads its context back from the KV slots, so a rewind that left a rejected
draft's KV in place (or a table that lost the accepted ones) changes the tokens it generates.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from core.hashing import hash_block, root_hash
from core.kv_events import BlockStored
from engine.request import FinishReason
from engine.scheduler.output import SchedulerOutput

from .conftest import VOCAB, FakeKVRunner, Harness, next_token, reference_tokens


def _verify(runner: FakeKVRunner, output: SchedulerOutput) -> tuple[dict[str, int], dict[str, int]]:
    """Run a plan; verify rows accept drafts while they equal the fake model's greedy token."""
    sampled = runner.execute(output)
    accepted: dict[str, int] = {}
    for item in output.scheduled:
        drafts = item.draft_token_ids
        if not drafts:
            continue
        known = item.end_position - len(drafts)  # context length before the first draft
        context = [runner.slots[runner.slot(item.block_ids, p)] for p in range(item.end_position)]
        num = 0
        while num < len(drafts) and drafts[num] == next_token(context[: known + num]):
            num += 1
        sampled[item.request_id] = next_token(context[: known + num])
        accepted[item.request_id] = num
    return sampled, accepted


def _wrong(token_id: int) -> int:
    return 1 + token_id % (VOCAB - 1)  # never token_id, never EOS


def _run(
    harness: Harness, truths: dict[str, list[int]], *, k: int = 4, seed: int = 0
) -> list[SchedulerOutput]:
    """Step to the end; after every step each decoding request gets ``k`` drafts, a random
    number of them right (the true continuation), then wrong ones."""
    rng = random.Random(seed)
    scheduler = harness.scheduler
    plans: list[SchedulerOutput] = []
    for _ in range(500):
        if not scheduler.has_unfinished():
            return plans
        output = scheduler.schedule()
        scheduler.check_integrity()
        assert output.num_scheduled_tokens <= scheduler.max_num_batched_tokens
        plans.append(output)
        sampled, accepted = _verify(harness.runner, output)
        for update in scheduler.update_from_output(output, sampled, accepted):
            harness.outputs[update.request_id].extend(update.new_token_ids)
            if update.finished:
                harness.reasons[update.request_id] = update.finish_reason
                continue
            request = scheduler.get_request(update.request_id)
            assert request is not None
            done = request.num_tokens
            truth = truths[update.request_id]
            num_right = rng.randrange(k + 1)
            drafts = truth[done : done + num_right]
            drafts += [_wrong(t) for t in truth[done + len(drafts) : done + k]]
            scheduler.set_draft_tokens(update.request_id, drafts)
        scheduler.check_integrity()
    raise AssertionError("still unfinished after 500 steps")


def _stored_tokens(harness: Harness) -> list[tuple[list[Any], list[int]]]:
    return [
        (event.block_hashes, event.token_ids)
        for batch in harness.batches
        for event in batch.events
        if isinstance(event, BlockStored)
    ]


def _true_hashes(sequence: Sequence[int], block_size: int) -> set[Any]:
    hashes = set()
    parent = root_hash(3)
    for start in range(0, len(sequence) - block_size + 1, block_size):
        parent = hash_block(parent, sequence[start : start + block_size])
        hashes.add(parent)
    return hashes


def test_verify_rows_generate_the_reference_and_never_cache_rejected_drafts(
    make_harness: Any,
) -> None:
    harness = make_harness(num_blocks=64, block_size=4, budget=16)
    prompts = {"a": [3, 4, 5, 6, 7], "b": [9, 8, 7, 6, 5, 4, 3, 2, 1], "c": [11] * 6}
    max_tokens = {"a": 23, "b": 7, "c": 30}
    truths = {}
    for request_id, prompt in prompts.items():
        harness.add(request_id, prompt, max_tokens=max_tokens[request_id])
        truths[request_id] = prompt + reference_tokens(prompt, max_tokens[request_id] + 8)
    plans = _run(harness, truths)
    for request_id, prompt in prompts.items():
        assert harness.outputs[request_id] == reference_tokens(prompt, max_tokens[request_id])
        assert harness.reasons[request_id] is FinishReason.LENGTH
    assert any(item.draft_token_ids for plan in plans for item in plan.scheduled)
    stats = harness.scheduler.stats().spec_decode
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert stats.num_accepted_tokens == sum(stats.num_accepted_tokens_per_pos)
    assert list(stats.num_accepted_tokens_per_pos) == sorted(
        stats.num_accepted_tokens_per_pos, reverse=True
    )
    harness.assert_pool_whole()
    allowed = set().union(*(_true_hashes(truths[r], 4) for r in prompts))
    stored = _stored_tokens(harness)
    assert stored
    for hashes, _tokens in stored:
        assert set(hashes) <= allowed


def test_drafts_never_pass_max_tokens_or_the_budget(make_harness: Any) -> None:
    harness = make_harness(num_blocks=64, block_size=4, budget=6)
    prompts = {name: [20 + i, 21, 22] for i, name in enumerate("abcd")}
    truths = {}
    for request_id, prompt in prompts.items():
        harness.add(request_id, prompt, max_tokens=6)
        truths[request_id] = prompt + reference_tokens(prompt, 20)
    plans = _run(harness, truths, k=5, seed=1)
    for request_id, prompt in prompts.items():
        assert harness.outputs[request_id] == reference_tokens(prompt, 6)
    for plan in plans:
        assert plan.num_scheduled_tokens <= 6
        for item in plan.scheduled:
            if item.draft_token_ids:
                request_outputs = item.num_output_tokens
                assert request_outputs + len(item.draft_token_ids) + 1 <= 6
    harness.assert_pool_whole()


def test_a_stop_token_among_accepted_drafts_ends_the_request_there(make_harness: Any) -> None:
    harness = make_harness()
    prompt = [5, 6, 7, 8]
    reference = reference_tokens(prompt, 30)
    stop = reference[5]
    expected = reference[: reference.index(stop) + 1]
    harness.add("s", prompt, max_tokens=30, stop_token_ids=[stop])
    truths = {"s": prompt + reference}
    scheduler = harness.scheduler
    # always draft the whole true continuation: the stop token arrives inside a verify row
    while scheduler.has_unfinished():
        output = scheduler.schedule()
        sampled, accepted = _verify(harness.runner, output)
        for update in scheduler.update_from_output(output, sampled, accepted):
            harness.outputs["s"].extend(update.new_token_ids)
            if update.finished:
                harness.reasons["s"] = update.finish_reason
            else:
                done = len(prompt) + len(harness.outputs["s"])
                scheduler.set_draft_tokens("s", truths["s"][done : done + 4])
        scheduler.check_integrity()
    assert harness.outputs["s"] == expected
    assert harness.reasons["s"] is FinishReason.STOP
    harness.assert_pool_whole()


def test_drafts_are_refused_for_requests_not_decoding(make_harness: Any) -> None:
    harness = make_harness()
    harness.add("w", [1, 2, 3])
    assert not harness.scheduler.set_draft_tokens("w", [4, 5])  # still waiting
    assert not harness.scheduler.set_draft_tokens("unknown", [4])
