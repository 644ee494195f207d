"""A stepped upgrade through a real local Ray Serve cluster, under streaming greedy load.

The pieces ``benchmarks/rolling_upgrade.py --serve`` and the live chaos test
(``tests/integration/test_stepped_upgrade.py``) share: ``pdserve up`` of ``configs/local.yaml``
on ``builtin:tiny-llama`` (free ports, a private cache), streaming clients over long
(remote-prefill) and short prompts, ``pdserve upgrade --stepped`` to a second config, a
watcher that polls Serve for both apps' pool counts (the P:D bound of every step, and every
replica's pid), the ingress's ``/metrics``, and ``/dev/shm`` before and after ``pdserve down``.

The second config either loads another checkpoint of the same architecture (other weights:
every output must equal one version's own greedy output) or keeps the weights and changes an
engine option (same KV fingerprint, pools still replaced: every output must equal the one
greedy output). The references come from the offline ``engine.LLM`` of each checkpoint.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from cluster.ops.upgrade_plan import ratio_deviation
from core.builtin_models import builtin_name
from core.sampling import SamplingParams
from core.shared_memory import NAME_PREFIX, SHM_DIR

REPO = Path(__file__).resolve().parents[1]
MODEL = "builtin:tiny-llama"
SERVED = "tiny"
ENGINE = {"max_model_len": 512, "kv_cache_memory_bytes": 16 << 20, "max_num_seqs": 8}
"""Engine options of both versions (and of the offline references)."""
THRESHOLD_TOKENS = 32
"""Prompts of this many tokens or more prefill on the prefill pool; shorter ones locally."""
ROLLOUT_SUFFIX = "-rollout"
POOLS = ("Prefill", "Decode")


@dataclass(frozen=True)
class Scenario:
    """One upgrade under load."""

    other_weights: bool = True
    """The new config loads other weights (else: the same, another ``max_num_seqs``)."""
    num_prefill: int = 1
    num_decode: int = 2
    clients: int = 3
    max_tokens: int = 8
    warmup_requests: int = 8
    """Requests on the fresh cluster before the measured ones (their first-request costs are
    no baseline)."""
    baseline_requests: int = 0
    """Requests measured before the upgrade (``p99_ttft_before_ms``); 0: the warm-up ones."""
    churn: bool = False
    """Before the upgrade, the peer: start and stop as many replicas of the same version, one
    at a time, with no upgrade (``p99_ttft_churn_ms``): what starting a replica next to the
    serving ones costs on this machine by itself."""
    drain_timeout_s: float | None = None
    """``--drain-timeout`` of the upgrade (None: the CLI's default)."""
    graceful_shutdown_timeout_s: float | None = None
    """The running app's decode pool's (None: the config's): how long Serve lets a stopping
    decode replica finish before its streams break and migrate."""
    seed: int = 5


def prompts(seed: int) -> list[list[int]]:
    """Long prompts (remote prefill) and short ones (local), token ids of the byte tokenizer."""
    rng = random.Random(seed)
    return [[rng.randrange(3, 250) for _ in range(n)] for n in (70, 90, 50, 40, 12, 20, 66)]


def write_other_weights(directory: Path, seed: int = 4242) -> Path:
    """A checkpoint of tiny-llama's architecture with other weights, under ``directory``."""
    from engine.builtin.specs import BUILTIN_SPECS
    from engine.builtin.writer import write_checkpoint

    path = directory / "tiny-llama-other-weights"
    path.mkdir(parents=True, exist_ok=True)
    write_checkpoint(dataclasses.replace(BUILTIN_SPECS["tiny-llama"], seed=seed), path)
    return path


def greedy_references(
    models: Sequence[str], all_prompts: list[list[int]], max_tokens: int
) -> list[dict[str, str]]:
    """Per prompt: each checkpoint's own greedy output (the offline ``LLM``), by model."""
    from engine.llm import LLM

    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    texts: list[dict[str, str]] = [{} for _ in all_prompts]
    for model in models:
        llm = LLM(model, dtype="float32", max_model_len=ENGINE["max_model_len"],
                  kv_cache_memory_bytes=ENGINE["kv_cache_memory_bytes"])  # fmt: skip
        outputs = llm.generate(prompt_token_ids=all_prompts, sampling_params=greedy)
        for index, output in enumerate(outputs):
            texts[index][model] = output.text
        llm.shutdown()
    return texts


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cluster_config(model: str, num_prefill: int, num_decode: int) -> dict[str, Any]:
    """``configs/local.yaml`` serving ``model`` as ``tiny`` on free ports."""
    config: dict[str, Any] = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    config["model"] = {"name": model, "dtype": "float32", "served_name": SERVED}
    config["engine"] = {**config["engine"], **ENGINE}
    config["prefill"]["num_replicas"] = num_prefill
    config["decode"]["num_replicas"] = num_decode
    config["disaggregation"]["local_prefill_threshold_tokens"] = THRESHOLD_TOKENS
    config["server"]["port"] = free_port()
    config["cluster"]["dashboard_port"] = free_port()
    return config


def pdserve(
    *args: str, env: Mapping[str, str], timeout_s: float = 600
) -> subprocess.CompletedProcess[str]:
    """The ``pdserve`` CLI, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "cluster.ops.cli", *args], env=dict(env), capture_output=True,
        text=True, timeout=timeout_s, check=False, cwd=REPO,
    )  # fmt: skip


def private_env(directory: Path) -> dict[str, str]:
    """An environment whose run state and model cache live under ``directory`` (the built-in
    copied in from the shared cache, so no replica writes it again)."""
    from engine.builtin import resolve_model

    cache = directory / "cache"
    name = builtin_name(MODEL)
    assert name is not None
    shutil.copytree(resolve_model(MODEL), cache / "models" / name, dirs_exist_ok=True)
    return {**os.environ, "PYTHONPATH": str(REPO), "PDSERVE_CACHE_DIR": str(cache)}


@dataclass
class Outcome:
    """One streamed request."""

    phase: str
    prompt: int
    ttft_s: float
    text: str
    error: str | None
    started_s: float = 0.0
    """``time.perf_counter()`` when the request was sent."""


def stream_once(http: httpx.Client, prompt: list[int], max_tokens: int) -> tuple[float, str]:
    """One streamed greedy completion: (time to first token, text); raises on any failure."""
    body = {"model": SERVED, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}  # fmt: skip
    started_s, ttft_s, parts = time.perf_counter(), 0.0, []
    with http.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code} {response.read()[:200]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"error event {event['error']}")
            if not ttft_s:
                ttft_s = time.perf_counter() - started_s
            parts.append(event["choices"][0]["text"])
    return ttft_s, "".join(parts)


class StreamingLoad:
    """``clients`` threads streaming the prompts in turn until stopped; ``phase`` labels each
    request by when it started."""

    def __init__(
        self, endpoint: str, all_prompts: list[list[int]], max_tokens: int, clients: int
    ) -> None:
        self.phase = "before"
        self.outcomes: list[Outcome] = []
        self._endpoint, self._prompts, self._max_tokens = endpoint, all_prompts, max_tokens
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._client, args=(i, clients), daemon=True)
            for i in range(clients)
        ]

    def __enter__(self) -> StreamingLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=180)

    def _client(self, first: int, stride: int) -> None:
        with httpx.Client(base_url=self._endpoint, timeout=120) as http:
            for turn in itertools.count(first, stride):
                if self._stop.is_set():
                    return
                index, phase = turn % len(self._prompts), self.phase
                started_s = time.perf_counter()
                try:
                    ttft_s, text = stream_once(http, self._prompts[index], self._max_tokens)
                    self.outcomes.append(Outcome(phase, index, ttft_s, text, None, started_s))
                except (httpx.HTTPError, RuntimeError, ValueError) as e:
                    error = repr(e)[:300]
                    self.outcomes.append(Outcome(phase, index, 0.0, "", error, started_s))


@dataclass
class PoolWatch:
    """Polls Serve's details of the running app and its rollout app: the worst P:D ratio
    deviation either version's pools showed (target and running counts), and every pool
    replica's pid (whose ``/dev/shm`` segments are this cluster's)."""

    details: Any
    """Returns Serve's instance details (``ServeRest.details``)."""
    app_name: str
    num_prefill: int
    num_decode: int
    interval_s: float = 0.3
    max_deviation: float = 0.0
    worst: str = ""
    pids: set[int] = field(default_factory=set)
    replica_ids: dict[str, set[str]] = field(default_factory=dict)
    """The running app's deployments (pools aside) -> every replica id seen."""
    num_polls: int = 0
    poll_errors: int = 0
    measuring: bool = True
    """False while the benchmark resizes the pools itself (the churn), which the P:D bound
    is not about."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> PoolWatch:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.observe(self.details())
            except Exception:  # NOTE: a poll that failed (Serve busy) is counted, not fatal
                self.poll_errors += 1

    def observe(self, details: Mapping[str, Any]) -> None:
        """One poll of Serve's details."""
        self.num_polls += 1
        running_app = details.get("applications", {}).get(self.app_name, {})
        for name, deployment in running_app.get("deployments", {}).items():
            if name not in POOLS:
                ids = {str(r.get("replica_id")) for r in deployment.get("replicas", [])}
                self.replica_ids.setdefault(name, set()).update(ids)
        for app in (self.app_name, self.app_name + ROLLOUT_SUFFIX):
            deployments = details.get("applications", {}).get(app, {}).get("deployments", {})
            if not all(pool in deployments for pool in POOLS):
                continue
            target, running = [], []
            self.pids |= replica_pids(details)
            for pool in POOLS:
                replicas = deployments[pool].get("replicas", [])
                target.append(int(deployments[pool].get("target_num_replicas", 0)))
                running.append(sum(r.get("state") == "RUNNING" for r in replicas))
            for counts in (target, running) if self.measuring else ():
                deviation = ratio_deviation(counts[0], counts[1], self.num_prefill, self.num_decode)
                if deviation > self.max_deviation:
                    self.max_deviation, self.worst = deviation, f"{app} P:D {counts}"

    def restarted(self) -> list[str]:
        """The running app's deployments (pools aside: the ingress, the stats board) that had
        a replica replaced while watched: a rollout should restart none of them."""
        return sorted(name for name, ids in self.replica_ids.items() if len(ids) > 1)


def replica_pids(details: Mapping[str, Any]) -> set[int]:
    """The pid of every replica of every deployment Serve lists."""
    return {
        int(replica["pid"])
        for app in details.get("applications", {}).values()
        for deployment in app.get("deployments", {}).values()
        for replica in deployment.get("replicas", [])
        if replica.get("pid")
    }


def metric(endpoint: str, name: str, label: str = "") -> float:
    """The sum of ``name``'s samples on the ingress's ``/metrics`` (those naming ``label``,
    e.g. ``reason="handed_off"``, when given)."""
    total = 0.0
    for line in httpx.get(f"{endpoint}/metrics", timeout=30).text.splitlines():
        if line.startswith((name + "{", name + " ")) and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def shm_segments() -> set[str]:
    """pdserve's KV segments in ``/dev/shm`` now (any process's)."""
    return {n for n in os.listdir(SHM_DIR) if n.startswith(NAME_PREFIX)}


def segments_of(names: set[str], pids: set[int]) -> set[str]:
    """The segments created by one of ``pids`` (``pdserve-kv-<ns>-<pid>-<token>``)."""
    return {n for n in names if any(f"-{pid}-" in n for pid in pids)}


def p99(values: list[float]) -> float:
    """The 99th percentile (0 for no values)."""
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[98]


@dataclass
class Result:
    """What one upgrade under load showed."""

    outcomes: list[Outcome]
    references: list[dict[str, str]]
    """Per prompt: each version's own greedy output, by model."""
    upgrade: subprocess.CompletedProcess[str]
    upgrade_s: float
    watch: PoolWatch
    kv_blocks_used_after: float
    migrations: float
    handoffs: float
    """Of the migrations, streams a leaving decode replica handed off."""
    handoff_blocks_pulled: float
    """KV blocks the replicas continuing handed-off streams pulled (not recomputed)."""
    shm_left_after_upgrade: set[str]
    shm_left_after_down: set[str]
    churn_s: float | None = None
    """How long the peer's replica churn took (None: no churn ran)."""

    @property
    def failures(self) -> list[Outcome]:
        """Requests that failed."""
        return [o for o in self.outcomes if o.error is not None]

    @property
    def mixed(self) -> list[Outcome]:
        """Completed requests whose output is no version's own greedy output of its prompt."""
        done = [o for o in self.outcomes if o.error is None]
        return [o for o in done if o.text not in self.references[o.prompt].values()]

    def versions_answering(self) -> set[str]:
        """The models whose own output some completed request got, on prompts where the
        versions' outputs differ."""
        return {
            model
            for o in self.outcomes
            if o.error is None and len(set(self.references[o.prompt].values())) > 1
            for model, text in self.references[o.prompt].items()
            if text == o.text
        }

    def summary(self) -> dict[str, Any]:
        """The benchmark's JSON keys."""
        before = [o.ttft_s for o in self.outcomes if o.phase == "before" and o.error is None]
        during = [o.ttft_s for o in self.outcomes if o.phase == "during" and o.error is None]
        churn = [o.ttft_s for o in self.outcomes if o.phase == "churn" and o.error is None]
        peer = {}
        if self.churn_s is not None:
            peer = {
                "requests_churn": len(churn),
                "p99_ttft_churn_ms": round(1000 * p99(churn), 1),
                "p99_ttft_churn_over_before": (
                    round(p99(churn) / p99(before), 3) if before and churn else None
                ),
                "churn_s": round(self.churn_s, 2),
            }
        return {
            "requests": len(self.outcomes),
            "requests_during": len(during),
            "requests_failed": len(self.failures),
            "mixed_version_outputs": len(self.mixed),
            "p99_ttft_before_ms": round(1000 * p99(before), 1),
            "p99_ttft_during_ms": round(1000 * p99(during), 1),
            "p99_ttft_during_over_before": (
                round(p99(during) / p99(before), 3) if before and during else None
            ),
            "upgrade_s": round(self.upgrade_s, 2),
            "max_pd_ratio_deviation": self.watch.max_deviation,
            "shm_segments_left": len(self.shm_left_after_upgrade | self.shm_left_after_down),
            "kv_blocks_used_after": self.kv_blocks_used_after,
            "request_migrations": self.migrations,
            "request_handoffs": self.handoffs,
            "handoff_blocks_pulled": self.handoff_blocks_pulled,
            "upgrade_rc": self.upgrade.returncode,
            "running_app_deployments_restarted": self.watch.restarted(),
            **peer,
        }


def churn_replicas(rest: Any, app_name: str, num_prefill: int, num_decode: int) -> float:
    """One replica more, then one fewer, of each pool replica in turn (as many starts and stops
    as the upgrade's steps, the same version); returns the seconds it took."""
    started_s = time.perf_counter()
    sizes = {"Prefill": num_prefill, "Decode": num_decode}

    def settled(pool: str, size: int) -> bool:
        deployment = (rest.app_details(app_name) or {}).get("deployments", {}).get(pool, {})
        replicas = deployment.get("replicas", [])
        return len(replicas) == size and all(r.get("state") == "RUNNING" for r in replicas)

    for pool, size in sizes.items():
        for _ in range(size):
            for target in (size + 1, size):
                rest.scale(app_name, {pool: target})
                if not wait_for(lambda p=pool, t=target: settled(p, t), 300):
                    raise RuntimeError(f"{pool} did not settle at {target} replicas")
    return time.perf_counter() - started_s


def wait_for(condition: Any, timeout_s: float, interval_s: float = 0.5) -> bool:
    """Poll ``condition`` until it holds or ``timeout_s`` passes; its last answer."""
    deadline_s = time.monotonic() + timeout_s
    while True:
        try:
            if condition():
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline_s:
            return False
        time.sleep(interval_s)


@contextmanager
def running_cluster(
    directory: Path, config: dict[str, Any], env: Mapping[str, str]
) -> Iterator[dict[str, Any]]:
    """``pdserve up --detach`` of ``config``; its run state; ``pdserve down`` on the way out."""
    path = directory / "old.yaml"
    path.write_text(yaml.safe_dump(config))
    try:
        up = pdserve("up", str(path), "--detach", env=env)
        if up.returncode != 0:
            raise RuntimeError(f"pdserve up failed: {up.stdout}{up.stderr}")
        state_file = Path(env["PDSERVE_CACHE_DIR"]) / "run" / "pdserve.json"
        yield json.loads(state_file.read_text())
    finally:
        pdserve("down", env=env)


Inspect = Callable[[Mapping[str, Any], Mapping[str, str]], None]
"""Looks at the cluster after the upgrade, before ``pdserve down``: (run state, environment)."""


def run_upgrade(scenario: Scenario, directory: Path, inspect: Inspect | None = None) -> Result:
    """``pdserve up``, the load, ``pdserve upgrade --stepped``, the checks (and ``inspect``),
    ``pdserve down``."""
    from cluster.ops.ray_session import attached
    from cluster.ops.rest import ServeRest

    env = private_env(directory)
    all_prompts = prompts(scenario.seed)
    new_model = str(write_other_weights(directory)) if scenario.other_weights else MODEL
    references = greedy_references(sorted({MODEL, new_model}), all_prompts, scenario.max_tokens)
    old = cluster_config(MODEL, scenario.num_prefill, scenario.num_decode)
    if scenario.graceful_shutdown_timeout_s is not None:
        old["decode"]["graceful_shutdown_timeout_s"] = scenario.graceful_shutdown_timeout_s
    new = json.loads(json.dumps(old))
    new["model"]["name"] = new_model
    if not scenario.other_weights:
        new["engine"]["max_num_seqs"] = ENGINE["max_num_seqs"] + 4  # replaced, same fingerprint
    new_path = directory / "new.yaml"
    new_path.write_text(yaml.safe_dump(new))
    upgrade_args = ["upgrade", "--stepped", str(new_path)]
    if scenario.drain_timeout_s is not None:
        upgrade_args += ["--drain-timeout", str(scenario.drain_timeout_s)]

    shm_before = shm_segments()
    with running_cluster(directory, old, env) as state:
        endpoint = state["endpoint"]
        with attached(state["ray_address"], auth_mode=state.get("ray_auth_mode")):
            rest = ServeRest(state["dashboard_url"])
            watch = PoolWatch(rest.details, state["app_name"], scenario.num_prefill,
                              scenario.num_decode)  # fmt: skip
            with watch, StreamingLoad(endpoint, all_prompts, scenario.max_tokens,
                                      scenario.clients) as load:  # fmt: skip
                if not wait_for(lambda: len(load.outcomes) >= scenario.warmup_requests, 300):
                    raise RuntimeError(f"no warm-up: {load.outcomes[:3]}")
                baseline_from_s, warm = time.perf_counter(), len(load.outcomes)
                if scenario.baseline_requests:
                    wait_for(lambda: len(load.outcomes) - warm >= scenario.baseline_requests, 300)
                churn_s = None
                if scenario.churn:
                    load.phase, watch.measuring = "churn", False
                    churn_s = churn_replicas(rest, state["app_name"], scenario.num_prefill,
                                             scenario.num_decode)  # fmt: skip
                    load.phase, watch.measuring, settled = "settle", True, len(load.outcomes)
                    wait_for(lambda: len(load.outcomes) - settled >= 2 * scenario.clients, 120)
                load.phase, started_s = "during", time.perf_counter()
                upgrade = pdserve(*upgrade_args, env=env)
                upgrade_s = time.perf_counter() - started_s
                load.phase = "after"
                if scenario.baseline_requests:  # sent before the baseline began: warm-up
                    for outcome in load.outcomes:
                        if outcome.started_s < baseline_from_s:
                            outcome.phase = "warmup"
                wait_for(lambda: sum(o.phase == "after" for o in load.outcomes) >= 2, 120)
            wait_for(lambda: metric(endpoint, "pdserve:kv_blocks_used") == 0, 60)
            kv_used = metric(endpoint, "pdserve:kv_blocks_used")
            migrations = metric(endpoint, "pdserve:request_migrations_total")
            handoffs = metric(endpoint, "pdserve:request_migrations_total", 'reason="handed_off"')
            pulled = metric(endpoint, "pdserve:decode_handoff_blocks_pulled_total")

            def left_by_gone_replicas() -> set[str]:
                gone = watch.pids - replica_pids(rest.details())
                return segments_of(shm_segments() - shm_before, gone)

            wait_for(lambda: not left_by_gone_replicas(), 30)
            left_after_upgrade = left_by_gone_replicas()
        if inspect is not None:
            inspect(state, env)
    left_after_down = segments_of(shm_segments() - shm_before, watch.pids)
    return Result(
        load.outcomes, references, upgrade, upgrade_s, watch, kv_used, migrations, handoffs,
        pulled, left_after_upgrade, left_after_down, churn_s,
    )  # fmt: skip
