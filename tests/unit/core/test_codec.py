"""One codec for every control message: exact round trips, loud failures, validation kept."""

from __future__ import annotations

import json

import pytest

from core.codec import from_plain, to_plain
from core.errors import (
    ErrorReport,
    MessageError,
    OverloadedError,
    PdserveError,
    SamplingParamsError,
    TransferError,
)
from core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from core.kv_handle import KVHandle
from core.messages import DecodeRequest, PrefillReply, PrefillResult, RoutingKeys, TokenChunk
from core.sampling import SamplingParams
from core.stats import ExpertLoadStats, ReplicaReport, ReplicaStats, TransferStats

HANDLE = KVHandle("xfer-1", "10.0.0.1:5000", 3, 4096, "abcd", 1_700_000_000_000, "epoch")
PARAMS = SamplingParams(max_tokens=7, temperature=0.5, stop=("\n", "END"), seed=3, logprobs=2)
MESSAGES = [
    DecodeRequest("r1", [1, 2, 3], PARAMS, RoutingKeys((9, 2**64 - 1), 3, "s"), 17, HANDLE),
    DecodeRequest("r2", [4], SamplingParams()),
    PrefillReply(result=PrefillResult("r1", 5, "hi", 16, HANDLE, None)),
    PrefillReply(error=ErrorReport.of(OverloadedError("busy", retry_after_s=2.5))),
    TokenChunk("r1", [1], "a", True, "error", 3, 0, ErrorReport.of(PdserveError("x"))),
    ReplicaReport(
        "decode",
        "rep-1",
        "actor",
        "node",
        "10.0.0.2",
        42,
        ReplicaStats(
            kv_blocks_total=10,
            transfer=TransferStats(failures_by_reason={"corrupt_chunk": 2}, seconds_total=1.5),
            expert_load=ExpertLoadStats(1, 10, 2, 500, 1.25, 4096),
        ),
    ),
    KVEventBatch(
        4,
        [BlockStored([1, 2], None, [5, 6, 7, 8], 2), BlockRemoved([3]), AllBlocksCleared()],
        2.0,
    ),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_json(message: object) -> None:
    plain = to_plain(message)
    assert from_plain(type(message), json.loads(json.dumps(plain))) == message


def test_decoding_validates_like_the_constructor() -> None:
    plain = to_plain(DecodeRequest("r1", [1], SamplingParams()))
    plain["sampling"]["top_p"] = 0.0
    with pytest.raises(SamplingParamsError) as info:
        from_plain(DecodeRequest, plain)
    assert info.value.param == "top_p"


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda p: p.update(colour=1), "unknown field"),
        (lambda p: p.pop("request_id"), "request_id"),
        (lambda p: p.update(prompt_token_ids=[1, "2"]), r"DecodeRequest\.prompt_token_ids"),
        (lambda p: p.update(first_token_id=True), r"DecodeRequest\.first_token_id"),
        (lambda p: p["routing"].update(block_hashes="12"), r"routing\.block_hashes"),
    ],
)
def test_a_malformed_message_fails_loudly_naming_the_field(mutate: object, match: str) -> None:
    plain = to_plain(DecodeRequest("r1", [1], SamplingParams(), first_token_id=3))
    mutate(plain)  # type: ignore[operator]
    with pytest.raises(MessageError, match=match):
        from_plain(DecodeRequest, plain)


def test_error_reports_rebuild_the_same_error() -> None:
    sent = TransferError("pull failed", reason="corrupt_chunk", param="kv_handle")
    report = from_plain(ErrorReport, json.loads(json.dumps(to_plain(ErrorReport.of(sent)))))
    got = report.to_error()
    assert type(got) is TransferError and got.reason == "corrupt_chunk"
    assert (got.message, got.param, got.status_code) == ("pull failed", "kv_handle", 503)
    assert report.retryable and not ErrorReport.of(SamplingParamsError("x")).retryable
    newer = ErrorReport("ErrorOfANewerPeer", "odd", 418, False, "p")
    assert (newer.to_error().status_code, newer.to_error().param) == (418, "p")


def test_prefill_reply_unwraps_to_its_result_or_raises_its_error() -> None:
    result = PrefillResult("r1", 5, "hi", 0, None, "stop")
    assert PrefillReply(result=result).unwrap() == result
    with pytest.raises(OverloadedError):
        PrefillReply(error=ErrorReport.of(OverloadedError("busy"))).unwrap()
    with pytest.raises(MessageError):
        PrefillReply().unwrap()
