"""End-to-end runs against the fake server: measured metrics match the server's known timing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.unit.loadtest.fake_server import FakeBehaviour

FIXED_10 = {"kind": "random", "input_len": {"tokens": 32}, "output_len": {"tokens": 10}}
# Client-side overhead on a busy 2-core machine: connect, send, thread hops. The lower bounds
# are strict (the client starts timing before the server's delay starts).
OVERHEAD_MS = 100.0


def test_metrics_match_the_servers_timing(fake_server: Callable, run_bench: Callable) -> None:
    _server, url = fake_server(FakeBehaviour(ttft_s=0.08, itl_s=0.02))
    out = run_bench(url, workload=FIXED_10, arrivals={"num_requests": 8, "max_concurrency": 4})
    s = out.summary
    assert s["completed"] == 8 and s["failed"] == 0
    assert s["total_output_tokens"] == 80
    assert s["total_input_tokens"] == 8 * 32  # from the server's usage.prompt_tokens
    # TTFT can only exceed the server's delay (the client starts timing first).
    assert 80.0 <= s["median_ttft_ms"] <= 80.0 + OVERHEAD_MS
    assert s["median_itl_ms"] == pytest.approx(20.0, abs=4.0)
    assert s["mean_tpot_ms"] == pytest.approx(20.0, abs=3.0)
    e2el_truth_ms = 80.0 + 9 * 20.0
    assert e2el_truth_ms - 5.0 <= s["median_e2el_ms"] <= e2el_truth_ms + OVERHEAD_MS
    assert all(len(r.itl_s) == 9 for r in out.records)
    assert s["request_throughput"] == pytest.approx(8 / s["duration"])
    # Two waves of four: the run lasts about two requests' latency.
    assert 2 * e2el_truth_ms / 1000 <= s["duration"] <= 2 * e2el_truth_ms / 1000 + 0.4


def test_concurrency_cap_is_respected(fake_server: Callable, run_bench: Callable) -> None:
    _server, url = fake_server(FakeBehaviour(ttft_s=0.03, itl_s=0.005))
    out = run_bench(url, workload=FIXED_10, arrivals={"num_requests": 12, "max_concurrency": 3})
    assert out.summary["max_concurrent_requests"] == 3
    assert out.summary["max_concurrency"] == 3
    assert sum(r.queue_s > 0.02 for r in out.records) >= 6  # later requests waited for a slot


def test_request_rate_spacing(fake_server: Callable, run_bench: Callable) -> None:
    server, url = fake_server(FakeBehaviour(ttft_s=0.005, itl_s=0.001))
    arrivals = {"num_requests": 10, "request_rate": 20.0, "burstiness": float("inf")}
    out = run_bench(url, arrivals=arrivals)
    lateness_s = np.array(sorted(r.start_s for r in out.records)) - 0.05 * np.arange(1, 11)
    assert (lateness_s >= -0.002).all()  # never before its arrival time
    assert np.median(lateness_s) < 0.02  # and on time unless the machine stalls
    assert len(server.received) == 10


def test_duration_stops_new_arrivals(fake_server: Callable, run_bench: Callable) -> None:
    _server, url = fake_server(FakeBehaviour(ttft_s=0.002, itl_s=0.001))
    arrivals = {"num_requests": 1000, "request_rate": 40.0, "burstiness": float("inf")}
    out = run_bench(url, arrivals={**arrivals, "duration_s": 0.31})
    assert len(out.records) == 12  # arrivals at 0.025 s steps, the last before 0.31 s


def test_goodput_counts_requests_within_slo(fake_server: Callable, run_bench: Callable) -> None:
    slow = {1: 0.6, 4: 0.6, 6: 0.6}
    _server, url = fake_server(FakeBehaviour(ttft_s=0.02, itl_s=0.002, ttft_overrides_s=slow))
    out = run_bench(url, workload=FIXED_10, arrivals={"num_requests": 8}, slo={"ttft_ms": 300})
    s = out.summary
    assert s["completed"] == 8
    assert round(s["request_goodput"] * s["duration"]) == 5
    assert sum(r.ttft_s >= 0.6 for r in out.records) == 3


def test_output_tokens_without_usage_fall_back_to_chunks(
    fake_server: Callable, run_bench: Callable
) -> None:
    _server, url = fake_server(FakeBehaviour(ttft_s=0.002, itl_s=0.001, include_usage=False))
    out = run_bench(url, workload=FIXED_10, arrivals={"num_requests": 3})
    assert {(r.output_tokens, r.output_token_source) for r in out.records} == {(10, "chunks")}
    assert out.summary["total_input_tokens"] == 3 * 32  # the planned (approximate) count


def test_multi_turn_carries_history_and_thinks(fake_server: Callable, run_bench: Callable) -> None:
    server, url = fake_server(FakeBehaviour(ttft_s=0.005, itl_s=0.002, include_usage=False))
    workload = {
        "kind": "multi-turn",
        "num_turns": 3,
        "system_prompt_len_tokens": 4,
        "user_len": {"tokens": 6, "distribution": "fixed"},
        "output_len": {"tokens": 3, "distribution": "fixed"},
        "think_time_s": 0.2,
        "think_time_distribution": "fixed",
    }
    out = run_bench(
        url,
        workload=workload,
        arrivals={"num_requests": 2},
        target={"endpoint": "/v1/chat/completions"},
    )
    assert out.summary["completed"] == 6
    assert out.summary["backend"] == "openai-chat"
    by_session: dict[str, list] = {}
    for received in server.received:
        by_session.setdefault(received.body["messages"][1]["content"], []).append(received)
    assert len(by_session) == 2
    for turns in by_session.values():
        roles = [[m["role"] for m in t.body["messages"]] for t in turns]
        assert roles == [
            ["system", "user"],
            ["system", "user", "assistant", "user"],
            ["system", "user", "assistant", "user", "assistant", "user"],
        ]
        last = turns[2].body["messages"]
        assert last[2]["content"] == last[4]["content"] == " t0 t1 t2"  # the server's answers
        assert last[:4] == turns[1].body["messages"]  # history grows, never rewritten
        gaps = np.diff([t.arrival_s for t in turns])
        assert (gaps >= 0.2).all()  # think time after each answer
    # Without usage, planned prompt tokens carry the history: 4 + 6, then + 3 + 6, + 3 + 6.
    assert sorted({r.prompt_tokens for r in out.records}) == [10, 19, 28]


def test_trace_replay_honours_timestamps_and_shares_prefixes(
    fake_server: Callable, run_bench: Callable, tmp_path: Path
) -> None:
    rows = [
        {"timestamp": 5000, "input_length": 24, "output_length": 3, "hash_ids": [7, 8]},
        {"timestamp": 5250, "input_length": 24, "output_length": 3, "hash_ids": [7, 9]},
        {"timestamp": 5500, "input_length": 20, "output_length": 3, "hash_ids": [7, 8]},
        {"timestamp": 6000, "input_length": 12, "output_length": 3, "hash_ids": [10]},
    ]
    (tmp_path / "trace.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    server, url = fake_server(FakeBehaviour(ttft_s=0.002, itl_s=0.001))
    workload = {"kind": "mooncake-trace", "path": "trace.jsonl", "block_size_tokens": 12}
    out = run_bench(url, workload=workload, arrivals={"num_requests": 10}, base_dir=tmp_path)
    assert out.summary["completed"] == 4
    # Sent at the trace's relative times (client clock), and received in that order.
    lateness_s = np.array(sorted(r.start_s for r in out.records)) - [0.0, 0.25, 0.5, 1.0]
    assert (lateness_s >= -0.002).all()
    assert np.median(lateness_s) < 0.03
    assert lateness_s.max() - lateness_s.min() < 0.1  # relative timing kept
    received = sorted(server.received, key=lambda r: r.arrival_s)
    words = [r.prompt_text.split() for r in received]
    assert [len(w) for w in words] == [24, 24, 20, 12]
    assert words[0][:12] == words[1][:12] == words[2][:12]  # hash id 7
    assert words[0][12:] != words[1][12:]  # 8 vs 9
    assert words[2][12:20] == words[0][12:20]  # hash id 8 again (partial block)
    assert words[3] != words[0][:12]
