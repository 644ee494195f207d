"""Index replication: the server's change log keeps followers identical; snapshots when behind."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cluster.routing.kv_index.holders import TierHit
from cluster.routing.kv_index.index import KVIndex
from cluster.routing.kv_index.replication import (
    KVIndexFollower,
    KVIndexServer,
    export_index,
    load_index,
)
from core.codec import from_plain
from core.errors import MessageError
from core.kv_index_messages import (
    CompactBatch,
    EntriesReply,
    IndexOp,
    PublishReply,
    ReplicaRemoved,
    ReplicaSnapshot,
    SnapshotReply,
    UpdatesReply,
    decode_updates_reply,
)


def compact(seq: int, *ops: tuple[Any, ...]) -> CompactBatch:
    return CompactBatch(seq, tuple(IndexOp(*op) for op in ops))


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def sync(server: KVIndexServer, follower: KVIndexFollower) -> UpdatesReply:
    update = server.updates(follower.epoch, follower.cursor)
    follower.apply_update(update)
    return update


def same_view(a: KVIndex, b: KVIndex) -> bool:
    return export_index(a) == export_index(b)


def test_follower_replays_the_log_to_the_same_index() -> None:
    server, follower = KVIndexServer(), KVIndexFollower()
    assert isinstance(sync(server, follower), SnapshotReply)  # a new follower starts from one
    server.resync("a", "prefill", [], 0)
    server.resync("d", "decode", [7], 0)
    assert server.publish("a", [compact(0, ("stored", [1, 2, 3]))]) == PublishReply(resync=False)
    server.publish("a", [compact(1, ("removed", [3])), compact(2, ("stored", [4]))])
    update = sync(server, follower)
    assert isinstance(update, EntriesReply) and len(update.entries) == 5
    assert same_view(server.index, follower.index)
    assert follower.index.match("prefill", [1, 2, 3]) == {"a": 2}
    assert follower.index.match("decode", [7]) == {"d": 1}
    assert sync(server, follower) == EntriesReply(server.epoch, server.cursor)  # nothing new


def test_gap_reported_to_the_worker_and_replayed_by_followers() -> None:
    server, follower = KVIndexServer(), KVIndexFollower()
    server.resync("a", "prefill", [], 0)
    server.publish("a", [compact(0, ("stored", [1]))])
    sync(server, follower)
    reply = server.publish("a", [compact(2, ("stored", [5])), compact(3, ("stored", [6]))])
    assert reply == PublishReply(resync=True)
    sync(server, follower)
    assert follower.index.is_degraded("a") and follower.index.match("prefill", [1]) == {}
    server.resync("a", "prefill", [1, 5, 6], 4)
    sync(server, follower)
    assert follower.index.match("prefill", [1, 5, 6]) == {"a": 3}
    assert same_view(server.index, follower.index)


def test_unknown_replica_is_asked_to_resync_and_heartbeats_keep_it() -> None:
    clock = FakeClock()
    server = KVIndexServer(replica_ttl_s=10.0, clock=clock)
    assert server.publish("a", [compact(3, ("stored", [1]))]) == PublishReply(resync=True)
    assert server.index.replica_ids() == []
    server.resync("a", "prefill", [1], 4)
    clock.now_s += 8
    assert server.publish("a", []) == PublishReply(resync=False)  # heartbeat
    clock.now_s += 8
    server.updates(None, 0)
    assert server.index.replica_ids() == ["a"]
    clock.now_s += 11  # silent past the TTL: a crashed replica is removed
    update = server.updates(server.epoch, server.cursor)
    assert server.index.replica_ids() == []
    assert isinstance(update, EntriesReply) and update.entries == (ReplicaRemoved("a"),)


def test_followers_behind_the_trimmed_log_or_of_another_epoch_get_a_snapshot() -> None:
    server = KVIndexServer(max_log_entries=3)
    follower = KVIndexFollower()
    sync(server, follower)
    server.resync("a", "prefill", [], 0)
    for seq in range(6):
        server.publish("a", [compact(seq, ("stored", [seq]))])
    update = sync(server, follower)
    assert isinstance(update, SnapshotReply)
    assert follower.index.match("prefill", [0, 1, 2, 3, 4, 5]) == {"a": 6}
    assert same_view(server.index, follower.index)
    restarted = KVIndexServer()  # a restarted actor: new epoch, empty index
    update = restarted.updates(follower.epoch, follower.cursor)
    assert isinstance(update, SnapshotReply)
    follower.apply_update(update)
    assert follower.index.replica_ids() == []


def test_log_is_bounded_by_hashes_too() -> None:
    server = KVIndexServer(max_log_entries=100, max_log_hashes=10)
    server.resync("a", "prefill", [], 0)
    server.publish("a", [compact(0, ("stored", list(range(8))))])
    server.publish("a", [compact(1, ("stored", list(range(8, 16))))])
    assert server.stats().num_log_entries == 1
    assert server.stats().num_entries == 16


def test_remove_replica_is_logged_once() -> None:
    server, follower = KVIndexServer(), KVIndexFollower()
    server.resync("a", "prefill", [1], 0)
    sync(server, follower)
    assert server.remove_replica("a") and not server.remove_replica("a")
    sync(server, follower)
    assert follower.index.replica_ids() == []


def test_export_round_trips_degraded_replicas() -> None:
    index = KVIndex()
    index.resync("a", [1, 2], 5, pool="prefill")
    index.resync("b", [3], 0, pool="decode")
    index.mark_degraded("b")
    copy = load_index(export_index(index))
    assert copy.match("prefill", [1, 2]) == {"a": 2}
    assert copy.last_seq("a") == 4
    assert copy.is_degraded("b")


def test_followers_replay_tier_moves_and_tier_snapshots() -> None:
    server, follower = KVIndexServer(), KVIndexFollower()
    server.resync("d", "decode", [1], 0, {"disk": [3]})
    server.publish("d", [compact(0, ("stored", [2], "host"), ("removed", [1], "device"))])
    sync(server, follower)
    assert follower.index.match_tiers("decode", [1, 2, 3]) == {}  # 1 left the replica
    assert follower.index.match_tiers("decode", [2, 3]) == {"d": TierHit(0, 1, 1)}
    assert same_view(server.index, follower.index)
    copy = load_index(export_index(server.index))
    assert same_view(copy, server.index)
    assert copy.cached_hashes("d", "disk") == {3}


def test_unknown_media_and_kinds_are_refused() -> None:
    server = KVIndexServer()
    server.resync("d", "decode", [], 0)

    def batch(op: dict[str, Any]) -> dict[str, Any]:
        return {"replica_seq": 0, "ops": [{"hashes": [1], **op}]}

    with pytest.raises(MessageError, match=r"ops\[0\]\.medium: 'tape'"):
        from_plain(CompactBatch, batch({"kind": "stored", "medium": "tape"}))
    with pytest.raises(MessageError, match=r"ops\[0\]\.kind: 'moved'"):
        from_plain(CompactBatch, batch({"kind": "moved"}))
    with pytest.raises(MessageError, match="expected host, disk"):
        server.resync("d", "decode", [], 0, {"device": [1]})
    plain = {"replica_id": "d", "pool": "decode", "hashes": [], "seq": 0, "tiers": {"device": []}}
    with pytest.raises(MessageError, match="medium 'device'"):
        from_plain(ReplicaSnapshot, plain)
    assert server.index.cached_hashes("d") == set()


def test_the_plain_updates_decode_to_the_typed_ones() -> None:
    server = KVIndexServer()
    server.resync("d", "decode", [1], 0, {"host": [2]})
    server.publish("d", [compact(0, ("stored", [3]), ("removed", [1]))])
    server.remove_replica("d")
    for epoch, cursor in [(None, 0), (server.epoch, 0), (server.epoch, 2), (server.epoch, 3)]:
        for _ in range(2):  # a second router's poll gets the entries encoded for the first
            plain = json.loads(json.dumps(server.updates_plain(epoch, cursor)))
            assert decode_updates_reply(plain) == server.updates(epoch, cursor)
