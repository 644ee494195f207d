"""Disaggregation hooks: prefill-only pins, KV imports with local prefixes, import failures."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import InvalidRequestError, KVCacheError, PromptTooLongError
from core.hashing import hash_prompt_blocks
from core.kv_events import BlockStored
from core.sampling import SamplingParams
from engine.request import FinishReason, Request, RequestStatus

SEED = 3
SHARED = list(range(1, 9))  # two full blocks of 4
PROMPT = [*SHARED, 20, 21, 22, 23, 24, 25]  # 14 tokens: 3 full blocks + 2 tokens


def import_request(request_id: str, prompt: list[int], max_tokens: int = 6) -> Request:
    return Request(request_id, prompt, SamplingParams(max_tokens=max_tokens), eos_token_ids=(0,))


def prefill(make_harness: Any, prompt: list[int], max_tokens: int = 6) -> tuple[Any, int]:
    """Run a prefill-only request on a fresh engine; returns (harness, first token)."""
    p = make_harness()
    p.add("x", prompt, max_tokens=max_tokens, prefill_only=True)
    p.run()
    [first] = p.outputs["x"]
    return p, first


def test_prefill_only_pins_blocks_until_released(make_harness: Any, reference: Any) -> None:
    h = make_harness()
    h.add("p", PROMPT, max_tokens=5, prefill_only=True)
    output = h.scheduler.schedule()
    [update] = h.scheduler.update_from_output(output, h.runner.execute(output))
    assert update.status is RequestStatus.FINISHED_PREFILL and update.finished
    assert update.finish_reason is None
    assert update.new_token_ids == reference(PROMPT, 1)
    assert not h.scheduler.has_unfinished()
    pinned = h.scheduler.get_pinned_blocks("p")
    assert pinned is not None
    assert pinned.block_ids == [1, 2, 3, 4]
    assert pinned.block_hashes == hash_prompt_blocks(PROMPT, 4, seed=SEED)
    assert len(pinned.block_hashes) == 3 and pinned.num_tokens == 14
    assert pinned.first_token_id == update.new_token_ids[0]
    assert h.scheduler.stats().num_pinned == 1
    assert [h.scheduler.kv.pool.blocks[b].ref_cnt for b in pinned.block_ids] == [1, 1, 1, 1]
    h.scheduler.check_integrity()
    for _ in range(3):  # steps while pinned change nothing
        assert h.step().scheduled == []
    assert h.scheduler.release("p")
    assert not h.scheduler.release("p")  # idempotent
    assert not h.scheduler.release("unknown")
    assert h.scheduler.get_pinned_blocks("p") is None
    assert h.scheduler.kv.num_cached_blocks == 3  # full prompt blocks stay in the prefix cache
    h.assert_pool_whole()


def test_release_and_finish_ignore_requests_that_are_not_pinned(make_harness: Any) -> None:
    h = make_harness()
    h.add("a", [1, 2, 3], max_tokens=4)
    h.step()
    assert not h.scheduler.release("a")  # running, not pinned: untouched
    assert h.scheduler.get_request("a").status is RequestStatus.RUNNING  # type: ignore[union-attr]
    h.add("p", PROMPT, prefill_only=True)
    h.step()
    assert h.scheduler.finish("p", FinishReason.STOP)  # a stop string on the first token
    assert h.scheduler.get_pinned_blocks("p") is None
    assert not h.scheduler.release("p")
    h.scheduler.check_integrity()


def test_prefill_only_request_ended_by_its_first_token_is_not_pinned(make_harness: Any) -> None:
    h = make_harness()
    h.add("p", PROMPT, max_tokens=1, prefill_only=True)
    h.run()
    assert h.reasons["p"] is FinishReason.LENGTH
    assert h.scheduler.get_pinned_blocks("p") is None
    h.assert_pool_whole()


def test_import_reuses_the_local_prefix_and_decodes_identically(
    make_harness: Any, reference: Any
) -> None:
    p, first = prefill(make_harness, PROMPT)
    pinned = p.scheduler.get_pinned_blocks("x")
    d = make_harness()
    d.add("warm", [*SHARED, 99], max_tokens=1)  # caches SHARED's two blocks on decode
    d.run()
    d.batches.clear()
    allocation = d.scheduler.add_import_request(import_request("x", PROMPT), first)
    assert allocation.num_local_blocks == 2
    assert allocation.block_ids[:2] == [1, 2]
    assert allocation.missing_block_indices == [2, 3]
    x = d.scheduler.get_request("x")
    assert x is not None and x.status is RequestStatus.WAITING_FOR_KV
    assert x.num_cached_tokens == 8
    assert d.scheduler.has_unfinished()
    assert d.step().scheduled == []  # not runnable until its KV is in place
    for index in allocation.missing_block_indices:  # "pull" the missing blocks
        src, dst = pinned.block_ids[index], allocation.block_ids[index]  # type: ignore[union-attr]
        bs = d.runner.block_size
        d.runner.slots[dst * bs : (dst + 1) * bs] = p.runner.slots[src * bs : (src + 1) * bs]
    assert p.scheduler.release("x")
    assert d.scheduler.mark_kv_ready("x")
    assert not d.scheduler.mark_kv_ready("x")
    hashes = hash_prompt_blocks(PROMPT, 4, seed=SEED)
    assert [e for b in d.batches for e in b.events] == [
        BlockStored(
            block_hashes=[hashes[2]], parent_hash=hashes[1], token_ids=PROMPT[8:12], block_size=4
        )
    ]
    d.outputs["x"] = [first]
    [item] = d.step().scheduled
    assert (item.start_position, item.token_ids, item.samples_token) == (14, [first], True)
    d.run()
    assert d.outputs["x"] == reference(PROMPT, 6)
    d.assert_pool_whole()
    p.assert_pool_whole()


def test_import_of_a_fully_cached_block_aligned_prompt_pulls_nothing(make_harness: Any) -> None:
    prompt = list(range(1, 13))  # exactly 3 blocks
    _, first = prefill(make_harness, prompt)
    d = make_harness()
    d.add("warm", [*prompt, 50], max_tokens=1)
    d.run()
    allocation = d.scheduler.add_import_request(import_request("x", prompt), first)
    assert allocation.num_local_blocks == 3 and allocation.missing_block_indices == []
    assert d.scheduler.mark_kv_ready("x")
    d.outputs["x"] = [first]
    d.run()
    assert len(d.outputs["x"]) == 6
    d.assert_pool_whole()


@pytest.mark.parametrize("recompute", [True, False])
def test_failed_import_recomputes_identically_or_ends_with_error(
    make_harness: Any, reference: Any, recompute: bool
) -> None:
    _, first = prefill(make_harness, PROMPT)
    d = make_harness()
    d.scheduler.add_import_request(import_request("x", PROMPT), first)
    assert d.scheduler.mark_kv_failed("x", recompute=recompute)
    assert not d.scheduler.mark_kv_failed("x", recompute=recompute)
    assert not d.scheduler.mark_kv_ready("x")
    d.scheduler.check_integrity()
    d.outputs["x"] = [first]
    d.run()
    if recompute:
        assert d.outputs["x"] == reference(PROMPT, 6)
        assert d.plans[0].scheduled[0].token_ids == [*PROMPT, first]
    else:
        assert d.outputs["x"] == [first]
        assert d.plans == []  # nothing left to run
        assert d.scheduler.schedule().finished_request_ids == ["x"]
        assert d.scheduler.get_request("x") is None
    d.assert_pool_whole()


def test_import_without_room_is_refused_and_leaves_nothing_behind(make_harness: Any) -> None:
    d = make_harness(num_blocks=4)  # 3 usable blocks; the prompt needs 4
    d.add("busy", [1, 2, 3, 4, 5], max_tokens=3)
    d.step()
    refused = import_request("x", list(range(1, 12)))
    with pytest.raises(KVCacheError, match="no room to import"):
        d.scheduler.add_import_request(refused, 7)
    assert d.scheduler.get_request("x") is None
    assert refused.output_token_ids == [] and refused.num_tokens == 11  # left as given
    d.scheduler.check_integrity()
    d.run()
    d.assert_pool_whole()


def test_import_that_cannot_decode_is_rejected(make_harness: Any) -> None:
    d = make_harness(max_model_len=16)
    with pytest.raises(InvalidRequestError, match="first token already ends it"):
        d.scheduler.add_import_request(import_request("x", PROMPT, max_tokens=1), 7)
    with pytest.raises(PromptTooLongError):
        d.scheduler.add_import_request(import_request("y", list(range(16))), 7)
    d.scheduler.check_integrity()
    d.assert_pool_whole()
