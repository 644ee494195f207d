"""Token-level stops, max_model_len, finish() from outside, and abort in every state."""

from __future__ import annotations

from typing import Any

import pytest

from core.errors import PromptTooLongError
from core.sampling import SamplingParams
from engine.request import FinishReason, Request, RequestStatus

EOS = 0


def test_eos_stops_unless_ignored(make_harness: Any, reference: Any) -> None:
    h = make_harness()
    h.add("stop", [1, 2, 3], max_tokens=10)
    h.add("ignore", [1, 2, 3], max_tokens=4, ignore_eos=True)
    h.step()
    h.runner.override.update({"stop": EOS, "ignore": EOS})
    h.step()
    h.run()
    first = reference([1, 2, 3], 1)
    assert h.outputs["stop"] == [*first, EOS]
    assert h.reasons["stop"] is FinishReason.STOP
    assert h.outputs["ignore"][:2] == [*first, EOS] and len(h.outputs["ignore"]) == 4
    assert h.reasons["ignore"] is FinishReason.LENGTH
    h.assert_pool_whole()


def test_stop_token_ids_report_the_token(make_harness: Any) -> None:
    h = make_harness()
    h.add("a", [1, 2, 3], max_tokens=10, stop_token_ids=[44])
    h.step()
    h.runner.override["a"] = 44
    output = h.scheduler.schedule()
    [update] = h.scheduler.update_from_output(output, h.runner.execute(output))
    assert update.finished and update.finish_reason is FinishReason.STOP
    assert update.stop_reason == 44 and update.new_token_ids == [44]
    assert update.status is RequestStatus.FINISHED_STOPPED


def test_stop_tokens_do_not_count_before_min_tokens(make_harness: Any) -> None:
    h = make_harness()
    h.add("a", [1, 2, 3], max_tokens=10, min_tokens=2, stop_token_ids=[44])
    for _ in range(3):  # tokens 1 and 2 are within min_tokens: ignored
        h.runner.override["a"] = 44
        h.step()
    assert h.outputs["a"] == [44, 44, 44]
    assert h.reasons["a"] is FinishReason.STOP


def test_prompt_must_be_shorter_than_max_model_len(make_harness: Any) -> None:
    h = make_harness(max_model_len=12)
    with pytest.raises(PromptTooLongError) as info:
        h.add("a", list(range(12)))
    assert "12 tokens" in info.value.message and "max_model_len=12" in info.value.message
    assert info.value.param == "prompt" and info.value.status_code == 400
    h.add("b", list(range(11)), max_tokens=50)  # room for exactly one token
    h.run()
    assert len(h.outputs["b"]) == 1 and h.reasons["b"] is FinishReason.LENGTH


def test_decode_reaching_max_model_len_finishes_with_length(
    make_harness: Any, reference: Any
) -> None:
    h = make_harness(max_model_len=10)
    h.add("a", [1, 2, 3, 4], max_tokens=100)
    h.run()
    assert h.outputs["a"] == reference([1, 2, 3, 4], 6)
    assert h.reasons["a"] is FinishReason.LENGTH
    h.assert_pool_whole()


def test_max_model_len_is_capped_by_the_pool(make_harness: Any) -> None:
    h = make_harness(num_blocks=4, max_model_len=1000)  # 3 usable blocks of 4 tokens
    assert h.scheduler.max_model_len == 13
    with pytest.raises(PromptTooLongError, match=r"max_model_len=13.*capped by KV cache"):
        h.add("a", list(range(13)))
    h.add("b", list(range(1, 12)), max_tokens=100)
    h.run()  # alone in the pool, it must finish without preempting itself
    assert len(h.outputs["b"]) == 2 and h.reasons["b"] is FinishReason.LENGTH
    assert h.scheduler.stats().num_preemptions_total == 0


def test_finish_from_outside_frees_blocks_and_reports_once(make_harness: Any) -> None:
    h = make_harness()
    h.add("a", [1, 2, 3], max_tokens=10)
    h.step()
    assert h.scheduler.finish("a", FinishReason.STOP, stop_reason="\n\n")
    assert not h.scheduler.finish("a", FinishReason.STOP)
    assert not h.scheduler.finish("nobody", FinishReason.STOP)
    assert h.scheduler.schedule().finished_request_ids == ["a"]
    h.assert_pool_whole()


def test_abort_in_every_state_returns_the_pool_whole(make_harness: Any) -> None:
    h = make_harness(num_blocks=20, budget=16)
    h.add("pinned", list(range(20, 26)), max_tokens=20, prefill_only=True)
    h.add("running", list(range(1, 10)), max_tokens=20)
    h.step()
    h.add("chunking", list(range(1, 30)), max_tokens=20)  # shares 2 blocks with "running"
    h.add("waiting", list(range(40, 44)), max_tokens=20)
    h.step()
    h.scheduler.add_import_request(
        Request("import", list(range(60, 70)), SamplingParams(max_tokens=5)), first_token_id=3
    )
    expected = {
        "pinned": RequestStatus.FINISHED_PREFILL,
        "running": RequestStatus.RUNNING,
        "chunking": RequestStatus.RUNNING,
        "waiting": RequestStatus.WAITING,
        "import": RequestStatus.WAITING_FOR_KV,
    }
    for rid, status in expected.items():
        request = h.scheduler.get_request(rid)
        assert request is not None and request.status is status, rid
    assert h.scheduler.get_request("chunking").num_computed_tokens == 23  # type: ignore[union-attr]
    assert h.scheduler.block_table("chunking")[:2] == h.scheduler.block_table("running")[:2]
    for rid in expected:
        assert h.scheduler.abort(rid), rid
        h.scheduler.check_integrity()
        assert h.scheduler.block_table(rid) == []
        assert h.scheduler.get_request(rid) is None
    assert not h.scheduler.abort("running")
    assert not h.scheduler.has_unfinished()
    assert h.plans[-1].finished_request_ids == ["pinned"]  # ended at its prefill, reported once
    assert sorted(h.scheduler.schedule().finished_request_ids) == sorted(set(expected) - {"pinned"})
    h.assert_pool_whole()
