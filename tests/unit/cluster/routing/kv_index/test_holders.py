"""The index's compact storage against a plain model: one holder stored as a slot, several as a
bitmask, at slot numbers past one machine word."""

from __future__ import annotations

import random

import pytest

from cluster.routing.kv_index.index import KVIndex
from core.kv_index_messages import IndexOp
from tests.unit.cluster.routing.kv_index.engine_walk import engine_walk

MEDIA = ("device", "host", "disk")


@pytest.mark.parametrize("seed", range(3))
def test_random_stores_and_removes_agree_with_a_set_model(seed: int) -> None:
    rng = random.Random(seed)
    index = KVIndex()
    replicas = [f"r{i}" for i in range(90)]  # slots up to 89: masks wider than 64 bits
    model: dict[str, dict[str, set[int]]] = {r: {m: set() for m in MEDIA} for r in replicas}
    seqs = dict.fromkeys(replicas, 0)
    for replica in replicas:
        index.resync(replica, [], 0, pool="decode")
    for _ in range(1500):
        replica = rng.choice(replicas[:12] if rng.random() < 0.7 else replicas)
        medium = rng.choice(MEDIA) if rng.random() < 0.4 else "device"
        hashes = [rng.randrange(30) for _ in range(rng.randrange(1, 6))]
        roll = rng.random()
        if roll < 0.55:
            op = IndexOp("stored", hashes, medium)
            model[replica][medium].update(hashes)
        elif roll < 0.97:
            op = IndexOp("removed", hashes, medium)
            model[replica][medium].difference_update(hashes)
        else:
            op = IndexOp("cleared", [])
            model[replica]["device"].clear()
        index.apply_ops(replica, seqs[replica], [op])
        seqs[replica] += 1
        if rng.random() < 0.01:  # a replica leaves and comes back empty
            index.remove_replica(replica)
            index.resync(replica, [], seqs[replica], pool="decode")
            model[replica] = {m: set() for m in MEDIA}
    for replica in replicas:
        for medium in MEDIA:
            assert index.cached_hashes(replica, medium) == model[replica][medium]
    held = [set().union(*model[r].values()) for r in replicas]
    assert index.stats().num_entries == sum(len(h) for h in held)
    assert index.stats().num_hashes == len(set().union(*held))
    for _ in range(60):
        prompt = [rng.randrange(30) for _ in range(rng.randrange(1, 8))]
        expected = {}
        for replica in replicas:
            hit = engine_walk(model[replica], prompt)
            if sum(hit):
                expected[replica] = hit
        got = {
            r: (t.num_device, t.num_host, t.num_disk)
            for r, t in index.match_tiers("decode", prompt).items()
        }
        assert got == expected
