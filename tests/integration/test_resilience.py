"""The shared app under change: live scaling with traffic, clients that vanish mid-stream and a
prefill replica killed while requests flow. Nothing may fail, hang or leak KV."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import ray

from cluster.ops.scaling import scale
from core.shared_memory import NAME_PREFIX, SHM_DIR
from tests.cluster_fixtures import ServingApp, SimCluster
from tests.integration.support import APP_NAME, SERVED_NAME
from tests.waiting import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

PROMPTS = [
    "A long enough prompt to be prefilled remotely by the prefill pool, please.",
    "Short one",
]


@dataclass
class Traffic:
    """Outcomes of the background requests: status codes, error bodies, exceptions."""

    statuses: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, status: int, detail: str = "") -> None:
        """Note one finished request."""
        with self.lock:
            self.statuses.append(status)
            if status != 200:
                self.failures.append(f"{status}: {detail[:300]}")

    @property
    def num_ok(self) -> int:
        """Requests that succeeded so far."""
        with self.lock:
            return self.statuses.count(200)


@contextmanager
def traffic(app: ServingApp, num_clients: int = 2, max_tokens: int = 4) -> Iterator[Traffic]:
    """Clients sending completions back to back (long and short prompts) until the block ends;
    each request is bounded, so a hang shows up as a failure, never as a stuck test."""
    outcome, stop = Traffic(), threading.Event()

    def client_loop(index: int) -> None:
        with httpx.Client(timeout=90) as client:
            i = index
            while not stop.is_set():
                body = {
                    "model": SERVED_NAME,
                    "prompt": PROMPTS[i % len(PROMPTS)],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                }
                i += 1
                try:
                    response = client.post(app.url("/v1/completions"), json=body)
                    outcome.record(response.status_code, response.text)
                except httpx.HTTPError as e:
                    outcome.record(-1, repr(e))

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(num_clients)]
    for thread in threads:
        thread.start()
    try:
        yield outcome
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a request hung"


def _reporting(app: ServingApp, role: str) -> int:
    return len(app.board().get(role, []))


def _scaled(app: ServingApp, deployment: str, role: str, count: int) -> bool:
    return len(app.running_replicas(deployment)) == count and _reporting(app, role) == count


def test_each_pool_scales_up_and_down_while_requests_flow(
    app: ServingApp, sim_cluster: SimCluster
) -> None:
    steps = [("Prefill", "prefill", 2), ("Prefill", "prefill", 1)]
    steps += [("Decode", "decode", 2), ("Decode", "decode", 1)]
    with traffic(app) as outcome:
        for deployment, role, count in steps:
            before = outcome.num_ok
            kept = {r["replica_id"] for r in app.running_replicas(deployment)}
            pids_before = {r["pid"] for r in app.board().get(role, [])}
            scale(
                APP_NAME,
                count if role == "prefill" else None,
                count if role == "decode" else None,
                dashboard_url=sim_cluster.dashboard_url,
            )
            wait_until(
                lambda d=deployment, r=role, c=count: _scaled(app, d, r, c),  # type: ignore[misc]
                120,
                f"{deployment}={count}",
            )
            now = {r["replica_id"] for r in app.running_replicas(deployment)}
            assert kept <= now or now <= kept, "scaling restarted replicas instead of resizing"
            node = sim_cluster.prefill_node_id if role == "prefill" else sim_cluster.decode_node_id
            assert {r["node_id"] for r in app.running_replicas(deployment)} == {node}
            gone = pids_before - {r["pid"] for r in app.board().get(role, [])}
            wait_until(
                lambda g=gone: not _shm_segments_of(g),  # type: ignore[misc]
                30,
                f"the KV segments of the removed {role} replicas {sorted(gone)} unlinked",
            )
            wait_until(
                lambda n=before: outcome.num_ok >= n + 3,  # type: ignore[misc]
                60,
                "requests keep completing",
            )
    assert not outcome.failures, outcome.failures
    assert outcome.num_ok >= 12
    board = app.board()  # one checkpoint: one KV fingerprint on every replica of both pools
    fingerprints = {r["stats"]["kv_fingerprint"] for role in board.values() for r in role}
    assert len(fingerprints) == 1 and "" not in fingerprints, fingerprints


def _shm_segments_of(pids: set[int]) -> list[str]:
    """The shared KV segments in ``/dev/shm`` made by processes ``pids`` (``core.shared_memory``
    names carry their creator's pid)."""
    names = [n for n in os.listdir(SHM_DIR) if n.startswith(NAME_PREFIX)]
    return [n for n in names if any(f"-{pid}-" in n for pid in pids)]


def _kv_idle(app: ServingApp) -> bool:
    board = app.board()
    decode, prefill = board.get("decode", []), board.get("prefill", [])
    return (
        bool(decode and prefill)
        and all(
            r["stats"]["kv_blocks_used"] == 0 and r["stats"]["num_running"] == 0
            for r in decode + prefill
        )
        and all(r["stats"]["exports_pinned"] == 0 for r in prefill)
    )


def test_client_disconnect_mid_stream_frees_kv_on_both_sides(app: ServingApp) -> None:
    body = {
        "model": SERVED_NAME,
        "prompt": PROMPTS[0],
        "max_tokens": 1500,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", app.url("/v1/completions"), json=body, timeout=60) as response:
        assert response.status_code == 200
        lines = response.iter_lines()  # NOTE: held open; dropping it would close the stream
        events = 0
        while events < 3:
            line = next(lines)
            if line.startswith("data: "):
                assert json.loads(line[6:])["choices"]
                events += 1
        wait_until(
            lambda: any(r["stats"]["kv_blocks_used"] > 0 for r in app.board()["decode"]),
            30,
            "decode holds the request's KV while it streams",
        )
        lines.close()
    # the connection is closed here, long before the 1500th token
    wait_until(lambda: _kv_idle(app), 60, "decode and prefill free everything")
    metrics = httpx.get(app.url("/metrics"), timeout=30).text
    assert 'reason="client_disconnected"' in metrics


def test_killed_prefill_replica_fails_no_request_and_leaks_nothing(app: ServingApp) -> None:
    victim = app.board()["prefill"][0]
    with traffic(app, num_clients=3, max_tokens=6) as outcome:
        wait_until(lambda: outcome.num_ok >= 3, 60, "traffic flows before the kill")
        ray.kill(ray.get_actor(victim["actor_name"], namespace="serve"), no_restart=True)
        killed_at = len(outcome.statuses)
        wait_until(
            lambda: (
                {r["replica_id"] for r in app.running_replicas("Prefill")} - {victim["replica_id"]}
            ),
            120,
            "Serve replaces the killed prefill replica",
        )
        wait_until(lambda: len(outcome.statuses) >= killed_at + 6, 60, "requests keep finishing")
    clean = [f for f in outcome.failures if f.startswith(("503", "500"))]
    assert clean == outcome.failures, f"unclean failures: {outcome.failures}"
    for failure in clean:
        assert '"error"' in failure  # the OpenAI error shape, not a dropped connection
    assert outcome.num_ok >= 6
    wait_until(lambda: _kv_idle(app), 60, "KV gauges back to 0 after the kill")


def _disk_tier(report: dict[str, Any]) -> dict[str, Any]:
    tiers = {t["medium"]: t for t in report["stats"]["kv_tiers"]}
    return tiers["disk"]


def _prefill_report(app: ServingApp, replica_id: str | None = None) -> dict[str, Any] | None:
    for report in app.board().get("prefill", []):
        if replica_id is None or report["replica_id"] == replica_id:
            return report
    return None


def test_a_restarted_prefill_replica_serves_the_next_turn_from_its_disk_tier(
    app: ServingApp,
) -> None:
    prompt = "Warm restart: " + " ".join(f"word{i}" for i in range(40))
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": 2, "temperature": 0.0}
    first = httpx.post(app.url("/v1/completions"), json=body, timeout=60)
    assert first.status_code == 200, first.text
    victim = wait_until(
        lambda: (r := _prefill_report(app)) is not None and _disk_tier(r)["blocks_used"] >= 2 and r,
        60,
        "turn 1's blocks reach the prefill replica's disk tier",
    )
    ray.kill(ray.get_actor(victim["actor_name"], namespace="serve"), no_restart=True)
    restarted = wait_until(
        lambda: (
            (r := _prefill_report(app)) is not None
            and r["replica_id"] != victim["replica_id"]
            and _disk_tier(r)["blocks_used"] >= 2
            and r
        ),
        120,
        "Serve restarts the prefill replica and it re-indexes the disk tier",
    )
    assert _disk_tier(restarted)["hits_total"] == 0
    # the ingress may still fall back to local prefill for a cooldown after the kill: probe
    # with unrelated prompts until the new replica takes remote prefills again
    probes = iter(range(1000))

    def remote_prefill_works() -> bool:
        probe = {**body, "prompt": f"Probe {next(probes)}: " + "unrelated text " * 4}
        assert httpx.post(app.url("/v1/completions"), json=probe, timeout=60).status_code == 200
        report = _prefill_report(app, restarted["replica_id"])
        return report is not None and report["stats"]["requests_total"] > 0

    wait_until(remote_prefill_works, 90, "remote prefill reaches the restarted replica", 1.0)
    # turn 2 adds more new tokens than the local-prefill threshold: it goes to the prefill pool
    turn_2 = {**body, "prompt": prompt + " " + " ".join(f"next{i}" for i in range(40))}
    second = httpx.post(app.url("/v1/completions"), json=turn_2, timeout=60)
    assert second.status_code == 200, second.text
    wait_until(
        lambda: (
            (r := _prefill_report(app, restarted["replica_id"])) is not None
            and _disk_tier(r)["hits_total"] >= 2
        ),
        30,
        "turn 2's prefix is found in the restarted replica's disk tier",
    )
    wait_until(lambda: _kv_idle(app), 60, "KV gauges back to 0 after the restart")


def _migrations(app: ServingApp, reason: str = "") -> float:
    metrics = httpx.get(app.url("/metrics"), timeout=30).text
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("pdserve:request_migrations_total") and f'reason="{reason}' in line
    ]
    return sum(values)


def _stream_text(app: ServingApp, body: dict[str, Any], out: dict[str, str]) -> None:
    """Stream ``body``; ``out["text"]`` its text, ``out["error"]`` whatever failed."""
    texts: list[str] = []
    try:
        with httpx.stream(
            "POST", app.url("/v1/completions"), json={**body, "stream": True}, timeout=120
        ) as response:
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                payload = json.loads(line[6:])
                if "error" in payload:
                    out["error"] = str(payload["error"])
                else:
                    texts.append(payload["choices"][0]["text"])
    except httpx.HTTPError as e:
        out["error"] = repr(e)
    out["text"] = "".join(texts)


def test_killed_decode_replica_mid_stream_migrates_the_stream(
    app: ServingApp, sim_cluster: SimCluster
) -> None:
    scale(APP_NAME, None, 2, dashboard_url=sim_cluster.dashboard_url)
    wait_until(lambda: _scaled(app, "Decode", "decode", 2), 120, "Decode=2")
    body = {
        "model": SERVED_NAME,
        "prompt": PROMPTS[0],
        "max_tokens": 160,
        "temperature": 0,
        "ignore_eos": True,
    }
    reference = httpx.post(app.url("/v1/completions"), json=body, timeout=120)
    assert reference.status_code == 200, reference.text
    before = _migrations(app)
    texts: list[str] = []
    errors: list[str] = []
    stream_body = {**body, "stream": True}
    with httpx.stream("POST", app.url("/v1/completions"), json=stream_body, timeout=120) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: {"):
                texts.append(json.loads(line[6:])["choices"][0]["text"])
            if len(texts) >= 4:
                break
        victim = wait_until(
            lambda: next((d for d in app.board()["decode"] if d["stats"]["num_running"] > 0), None),
            30,
            "a decode replica is streaming the request",
        )
        ray.kill(ray.get_actor(victim["actor_name"], namespace="serve"), no_restart=True)
        for line in lines:
            if not line.startswith("data: {"):
                continue
            payload = json.loads(line[6:])
            if "error" in payload:
                errors.append(str(payload["error"]))
            else:
                texts.append(payload["choices"][0]["text"])
    assert not errors, errors
    assert "".join(texts) == reference.json()["choices"][0]["text"]  # nothing lost or repeated
    assert _migrations(app) == before + 1
    wait_until(lambda: _kv_idle(app), 60, "KV gauges back to 0 after the migration")


def test_a_decode_replica_scaled_away_hands_its_streams_off(
    app: ServingApp, sim_cluster: SimCluster
) -> None:
    scale(APP_NAME, None, 2, dashboard_url=sim_cluster.dashboard_url)
    wait_until(lambda: _scaled(app, "Decode", "decode", 2), 120, "Decode=2")
    before = _migrations(app, "handed_off")
    bodies: list[dict[str, Any]] = []
    outs: list[dict[str, str]] = []
    threads: list[threading.Thread] = []

    def both_streaming() -> bool:
        return all(d["stats"]["num_running"] > 0 for d in app.board()["decode"])

    def start_streams(count: int) -> None:
        for _ in range(count):
            body = {
                "model": SERVED_NAME,
                "prompt": f"Stream number {len(bodies)}: " + PROMPTS[0],
                "max_tokens": 320,
                "temperature": 0,
                "ignore_eos": True,
            }
            bodies.append(body)
            outs.append({})
            threads.append(threading.Thread(target=_stream_text, args=(app, body, outs[-1])))
            threads[-1].start()

    try:
        # more streams while only one replica holds any: the ingress's router may take a
        # moment to list the replica Serve restarted in the test before
        for _ in range(3):
            start_streams(4)
            with contextlib.suppress(AssertionError):
                wait_until(both_streaming, 10, "both decode replicas streaming")
                break
        assert both_streaming(), "the streams never reached both decode replicas"
        scale(APP_NAME, None, 1, dashboard_url=sim_cluster.dashboard_url)
    finally:
        for thread in threads:
            thread.join(timeout=150)
    assert not any(t.is_alive() for t in threads), "a stream hung"
    assert not [out["error"] for out in outs if "error" in out]
    # the stopped replica's streams went on elsewhere at once, not after its graceful shutdown
    assert _migrations(app, "handed_off") >= before + 1
    for body, out in zip(bodies, outs, strict=True):
        reference = httpx.post(app.url("/v1/completions"), json=body, timeout=120)
        assert out["text"] == reference.json()["choices"][0]["text"]  # nothing lost or repeated
    wait_until(lambda: _scaled(app, "Decode", "decode", 1), 120, "Decode=1")
    wait_until(lambda: _kv_idle(app), 60, "KV gauges back to 0 after the handoffs")
