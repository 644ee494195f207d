"""The KV-index channel's messages through ``core.codec``: every one round-trips through JSON,
the unions are told apart by their fields, and a malformed message is refused naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.codec import from_plain, to_plain
from core.errors import MessageError
from core.kv_index_messages import (
    CompactBatch,
    EntriesReply,
    ExportedReplica,
    IndexOp,
    IndexSnapshot,
    LogEntry,
    PublishReply,
    ReplicaBatch,
    ReplicaRemoved,
    ReplicaSnapshot,
    ShardStats,
    SnapshotReply,
    decode_updates_reply,
)

OPS = (IndexOp("stored", [1, 2**64 - 1]), IndexOp("removed", [2], "host"), IndexOp("cleared", []))
SNAPSHOT = ReplicaSnapshot("r0", "decode", [5, 6], 3, {"host": [7], "disk": []})
EXPORTED = ExportedReplica("r0", "decode", 2, True, [5], {"host": [7], "disk": [8]})
MESSAGES = [
    CompactBatch(4, OPS),
    CompactBatch(5),
    PublishReply(resync=True),
    SNAPSHOT,
    ReplicaBatch("r0", 4, OPS),
    ReplicaRemoved("r0"),
    IndexSnapshot((EXPORTED, ExportedReplica("r1", "prefill", -1, False, []))),
    ShardStats(2, 1, 9, 8, 40),
]
UPDATES = [
    EntriesReply("epoch-1", 12, (ReplicaBatch("r0", 4, OPS), SNAPSHOT, ReplicaRemoved("r0"))),
    EntriesReply("epoch-1", 12),
    SnapshotReply("epoch-2", 0, IndexSnapshot((EXPORTED,))),
]


def over_json(message: object) -> Any:
    return json.loads(json.dumps(to_plain(message)))


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_json(message: object) -> None:
    assert from_plain(type(message), over_json(message)) == message


@pytest.mark.parametrize("reply", UPDATES, ids=lambda r: type(r).__name__)
def test_an_updates_reply_comes_back_as_its_own_kind(reply: object) -> None:
    decoded = decode_updates_reply(over_json(reply))
    assert type(decoded) is type(reply) and decoded == reply
    if isinstance(decoded, EntriesReply) and isinstance(reply, EntriesReply):
        # log entries of every kind, told apart by their fields
        assert [type(e) for e in decoded.entries] == [type(e) for e in reply.entries]


def test_the_wire_form_keeps_the_shape_tools_read() -> None:
    """Operators' scripts and the integration tests read a shard's plain answers by key."""
    plain = over_json(SnapshotReply("e", 1, IndexSnapshot((EXPORTED,))))
    row = plain["snapshot"]["replicas"][0]
    assert (row["replica_id"], row["pool"], row["last_seq"], row["degraded"]) == (
        "r0",
        "decode",
        2,
        True,
    )
    assert to_plain(PublishReply(resync=False)) == {"resync": False}
    assert from_plain(CompactBatch, {"replica_seq": 10**15, "ops": []}) == CompactBatch(10**15)


@pytest.mark.parametrize(
    ("plain", "match"),
    [
        ({"replica_seq": 0, "ops": [{"kind": "moved", "hashes": [1]}]}, r"ops\[0\]\.kind: 'moved'"),
        (
            {"replica_seq": 0, "ops": [{"kind": "stored", "hashes": [1], "medium": "tape"}]},
            r"ops\[0\]\.medium: 'tape'",
        ),
        ({"replica_seq": 0, "ops": [{"kind": "stored", "hashes": ["1"]}]}, r"ops\[0\]\.hashes"),
        ({"replica_seq": "0", "ops": []}, r"CompactBatch\.replica_seq"),
        ({"ops": []}, "replica_seq"),
    ],
)
def test_a_malformed_batch_is_refused_naming_the_field(plain: Any, match: str) -> None:
    with pytest.raises(MessageError, match=match):
        from_plain(CompactBatch, plain)


def test_a_snapshot_of_an_unknown_tier_or_an_unknown_reply_is_refused() -> None:
    with pytest.raises(MessageError, match="medium 'device'; expected host, disk"):
        ReplicaSnapshot("r0", "decode", [], 0, {"device": [1]})
    plain = to_plain(SNAPSHOT)
    plain["tiers"] = {"tape": [1]}
    with pytest.raises(MessageError, match="medium 'tape'"):
        from_plain(ReplicaSnapshot, plain)
    with pytest.raises(MessageError, match="matches no single member"):
        decode_updates_reply({"epoch": "e", "cursor": 0})  # neither entries nor a snapshot
    entry: LogEntry = ReplicaRemoved("r0")
    bad = {"epoch": "e", "cursor": 1, "entries": [{**to_plain(entry), "colour": 1}]}
    with pytest.raises(MessageError, match=r"entries\[0\]"):
        decode_updates_reply(bad)
