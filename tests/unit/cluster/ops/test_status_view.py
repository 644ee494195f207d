"""``pdserve status`` rendering: one row per replica, with the KV tiers' blocks and hits."""

from __future__ import annotations

import time

from rich.console import Console

from cluster.ops.status_view import (
    fingerprint_cell,
    lora_cell,
    render_status,
    spec_cell,
    tiers_cell,
    versions_line,
)
from core.codec import to_plain
from core.stats import KVTierStats, LoRAAdapterStats, ReplicaStats, SpecDecodeStats


def _status(stats: ReplicaStats | None) -> dict[str, object]:
    replica = {
        "replica_id": "r1",
        "state": "RUNNING",
        "node_id": "n",
        "node_ip": "10.0.0.2",
        "stats": None if stats is None else to_plain(stats),
    }
    return {
        "app": "pdserve",
        "status": "RUNNING",
        "endpoint": "http://x",
        "dashboard": "http://y",
        "pools": [
            {
                "pool": "Decode",
                "role": "decode",
                "status": "HEALTHY",
                "target_replicas": 1,
                "replicas": [replica],
            },
            {
                "pool": "Prefill",
                "role": "prefill",
                "status": "HEALTHY",
                "target_replicas": 0,
                "replicas": [],
            },
        ],
    }


def test_tiers_cell_lists_the_lower_tiers() -> None:
    stats = ReplicaStats(
        kv_tiers=(
            KVTierStats("device", blocks_used=5, blocks_capacity=100),
            KVTierStats("host", blocks_used=120, blocks_capacity=4096, hits_total=37),
            KVTierStats("disk", blocks_used=900, blocks_capacity=65536, hits_total=12),
        )
    )
    assert tiers_cell(stats) == "host 120/4096 (37) disk 900/65536 (12)"
    assert tiers_cell(ReplicaStats()) == "off"


def test_a_speculating_replica_shows_its_mean_acceptance_length() -> None:
    stats = ReplicaStats(spec_decode=SpecDecodeStats(40, 160, 75, (30, 25, 20)))
    assert spec_cell(stats) == "2.88 (40)"
    assert spec_cell(ReplicaStats()) == "off"
    narrow = Console(record=True, width=80)
    render_status(_status(stats), narrow)
    lines = narrow.export_text().splitlines()
    assert any(line.split() == ["spec", "accept", "2.88", "(40)"] for line in lines), lines
    wide = Console(record=True, width=200)
    render_status(_status(stats), wide, wide=True)
    text = wide.export_text()
    assert "spec accept (drafts)" in text and "2.88 (40)" in text


def test_status_table_shows_tiers_per_replica() -> None:
    stats = ReplicaStats(
        kv_blocks_used=3,
        kv_blocks_total=64,
        kv_tiers=(KVTierStats("host", blocks_used=7, blocks_capacity=512, hits_total=4),),
    )
    console = Console(record=True, width=200)
    render_status(_status(stats), console)
    text = console.export_text()
    assert "tiers used/total (hits)" in text
    assert "host 7/512 (4)" in text and "3/64" in text
    console = Console(record=True, width=200)
    render_status(_status(None), console)
    assert "Prefill (0/0)" in console.export_text()


def test_an_80_column_terminal_gets_every_header_whole() -> None:
    stats = ReplicaStats(
        kv_blocks_used=3,
        kv_blocks_total=4096,
        kv_tiers=(KVTierStats("host", blocks_used=7, blocks_capacity=512, hits_total=4),),
    )
    status = _status(stats)
    status["pools"][0]["replicas"][0]["replica_id"] = "hxk2p0qz"  # type: ignore[index]
    status["pools"][0]["pool"] = "Decode-tiny-llama"  # type: ignore[index]
    console = Console(record=True, width=80)
    render_status(status, console)
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert "…" not in "\n".join(lines)  # nothing truncated
    header = next(line for line in lines if "replica" in line)
    assert header.split() == ["replica", "state", "node", "KV", "run", "wait", "xfer"]
    row = next(line for line in lines if "hxk2p0qz" in line)
    assert row.split() == ["hxk2p0qz", "RUNNING", "10.0.0.2", "3/4096", "0", "0", "0"]
    assert any(line.split() == ["tiers", "host", "7/512", "(4)"] for line in lines)
    assert any("Decode-tiny-llama (1/1)" in line for line in lines)
    wide = Console(record=True, width=80)  # --wide: every column whole, the lines run long
    render_status(status, wide, wide=True)
    text = wide.export_text()
    assert "tiers used/total (hits)" in text and "…" not in text
    assert max(len(line) for line in text.splitlines()) > 80


def test_status_shows_the_control_planes_recoveries() -> None:
    status = _status(None)
    status["control_plane"] = {
        "kv_index_restarts": 1.0,
        "stats_board_restarts": 0.0,
        "serve_controller_restarts": 2.0,
        "request_migrations": 3.0,
        "ingress_started_unix_s": time.time() - 42,
    }
    console = Console(record=True, width=200)
    render_status(status, console)
    line = next(x for x in console.export_text().splitlines() if x.startswith("control plane"))
    assert "ingress up 4" in line  # 42-43 s
    assert "kv index restarts 1" in line and "serve controller restarts 2" in line
    assert "request migrations 3" in line
    status["control_plane"] = None
    console = Console(record=True, width=200)
    render_status(status, console)
    assert "control plane: ingress /metrics unreachable" in console.export_text()


def test_status_shows_hot_prefix_copies_once_one_was_made() -> None:
    status = _status(None)
    counters = {
        "kv_index_restarts": 0.0,
        "stats_board_restarts": 0.0,
        "serve_controller_restarts": 0.0,
        "request_migrations": 0.0,
        "ingress_started_unix_s": time.time(),
        "hot_prefixes": 0.0,
        "prefix_copies_made": 0.0,
        "prefix_copies_dropped": 0.0,
        "prefix_copy_bytes": 0.0,
    }
    status["control_plane"] = counters
    console = Console(record=True, width=200)
    render_status(status, console)
    assert "hot prefixes" not in console.export_text()  # policy off or idle: no line
    counters.update(
        hot_prefixes=2.0,
        prefix_copies_made=5.0,
        prefix_copies_dropped=3.0,
        prefix_copy_bytes=3 * 2**20,
    )
    console = Console(record=True, width=200)
    render_status(status, console)
    line = next(x for x in console.export_text().splitlines() if x.startswith("hot prefixes"))
    assert line == "hot prefixes: 2 copied now; copies made 5, dropped 3; 3.0 MiB moved"


def test_each_replica_shows_its_short_kv_fingerprint() -> None:
    stats = ReplicaStats(kv_fingerprint="3f9a0c12d4e5f607")
    assert fingerprint_cell(stats) == "3f9a0c12"
    assert fingerprint_cell(ReplicaStats()) == "-"
    narrow = Console(record=True, width=80)
    render_status(_status(stats), narrow)
    lines = narrow.export_text().splitlines()
    assert any(line.split() == ["KV", "fp", "3f9a0c12"] for line in lines), lines
    assert all(len(line) <= 80 for line in lines), lines
    wide = Console(record=True, width=200)
    render_status(_status(stats), wide, wide=True)
    text = wide.export_text()
    assert "KV fp" in text and "3f9a0c12" in text and "3f9a0c12d" not in text


def test_a_fleet_of_two_fingerprints_shows_the_upgrade_in_progress() -> None:
    status = _status(ReplicaStats(kv_fingerprint="aaaaaaaa00000000"))
    decode = status["pools"][0]  # type: ignore[index]
    second = {**decode["replicas"][0], "replica_id": "r2"}
    second["stats"] = to_plain(ReplicaStats(kv_fingerprint="bbbbbbbb00000000"))
    decode["replicas"].append(second)
    assert versions_line(status) == "upgrade in progress: Decode 1 aaaaaaaa + 1 bbbbbbbb"
    console = Console(record=True, width=80)
    render_status(status, console)
    assert "upgrade in progress: Decode 1 aaaaaaaa + 1 bbbbbbbb" in console.export_text()
    assert versions_line(_status(ReplicaStats(kv_fingerprint="aaaaaaaa00000000"))) is None
    assert versions_line(_status(None)) is None


def test_a_replica_serving_adapters_shows_where_each_is() -> None:
    adapters = (LoRAAdapterStats("sql", "device"), LoRAAdapterStats("chat", "host"))
    stats = ReplicaStats(lora_adapters=adapters, served_adapters=("sql", "chat", "math"))
    assert lora_cell(stats) == "sql:device chat:host +1 cold"
    assert lora_cell(ReplicaStats()) == "off"
