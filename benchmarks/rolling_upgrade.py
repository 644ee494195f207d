"""A rolling upgrade under load, on one machine without Ray: does anything fail, mix versions
or stay behind, and what does it cost the time to first token?

Two checkpoints of one architecture: ``builtin:tiny-llama`` and the same with other weights
(written once to a temporary directory). The fleet starts as ``--prefill`` prefill and
``--decode`` decode replicas of the old checkpoint, each a worker from the real builders
(``build_prefill_worker`` / ``build_decode_worker``: gRPC on 127.0.0.1, the prefill's KV in a
shared segment under ``/dev/shm``, its KV fingerprint on every transport). The real ingress
serves ``--clients`` streaming clients over pool clients that place a request as the Serve
routers do (``kv_index.of_fingerprint`` over the live replicas) and pairs by fingerprint
(``dispatch.pairing``). After a warm-up the upgrade replaces one replica per step in
``rolling_steps`` order: the new-version replica is built and joins, the old one leaves the
fleet, drains (``--drain-timeout-s``) and shuts down. Then every replica shuts down, as
``pdserve down`` would.

Measured: ``requests_failed`` (non-200 or an error event), ``mixed_version_outputs`` (outputs
equal to neither version's own greedy output, from the offline ``LLM`` of each checkpoint),
``p99_ttft_during_over_before``, ``upgrade_s``, ``max_pd_ratio_deviation`` (replicas off the
config's P:D ratio, either version, any step) and ``shm_segments_left`` (this process's KV
segments in ``/dev/shm`` beyond the live replicas', after the upgrade and after the shutdown).

    .venv/bin/python benchmarks/rolling_upgrade.py [--prefill 1 --decode 2 --clients 4]

``--serve`` measures the same through a real local Ray Serve cluster instead
(``benchmarks/serve_upgrade.py``): ``pdserve up`` of ``configs/local.yaml`` on tiny-llama, the
same streaming load through the HTTP ingress, ``pdserve upgrade --stepped`` to the other
weights (``--drain-timeout-s`` as its ``--drain-timeout``), Serve polled for both apps' pool
counts during every step, then ``pdserve down``; ``shm_segments_left`` counts the segments of
the cluster's replicas left after the upgrade (by replicas gone) and after the down. Its
``p99_ttft_before_ms`` is measured over ``--baseline-requests`` requests sent after the warm-up
ones (a p99 of a few dozen requests is their maximum, and a fresh cluster's first requests
are no baseline). Its peer, in the same run on the same cluster before the upgrade: as many
replica starts and stops of the same version, one at a time, with no upgrade
(``p99_ttft_churn_over_before``): what a replica starting next to the serving ones costs on
this machine by itself (the new version's replicas start on the same cores; on a GPU fleet
they start on their own devices).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/rolling_upgrade.py --serve

The last line is one JSON object with those keys.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from cluster.ingress import IngressSettings, create_app
from cluster.ingress.model_table import ModelEndpoint
from cluster.ops.upgrade_plan import ratio_deviation, rolling_steps
from cluster.routing.kv_index import of_fingerprint
from core.config import DisaggregationConfig, EngineConfig, ModelConfig, TransferConfig
from core.messages import DecodeRequest, PrefillRequest, PrefillResult, TokenChunk
from core.sampling import SamplingParams
from core.shared_memory import NAME_PREFIX, SHM_DIR
from decode.build import build_decode_worker
from decode.worker import DecodeWorker
from engine.builtin.specs import BUILTIN_SPECS
from engine.builtin.writer import write_checkpoint
from engine.llm import LLM
from prefill.build import build_prefill_worker
from prefill.worker import PrefillWorker

ENGINE = EngineConfig(max_model_len=512, kv_cache_memory_bytes=16 << 20)
TRANSFER = TransferConfig(bind_host="127.0.0.1", insecure_test_token="rolling-upgrade-bench")
THRESHOLD_TOKENS = 32
SERVED = "tiny"

Worker = PrefillWorker | DecodeWorker


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefill", type=int, default=1, help="Prefill replicas (both versions).")
    p.add_argument("--decode", type=int, default=2, help="Decode replicas (both versions).")
    p.add_argument("--clients", type=int, default=4, help="Concurrent streaming clients.")
    p.add_argument("--max-tokens", type=int, default=8, help="Tokens per request.")
    p.add_argument("--warmup-requests", type=int, default=16, help="Requests before upgrading.")
    p.add_argument(
        "--no-churn", action="store_true",
        help="--serve: skip the peer (as many replica starts and stops of the same version "
        "before the upgrade, p99_ttft_churn_over_before).",
    )  # fmt: skip
    p.add_argument(
        "--baseline-requests", type=int, default=100,
        help="--serve: requests measured before the upgrade, after the warm-up ones (0: the "
        "warm-up ones are the baseline).",
    )  # fmt: skip
    p.add_argument("--drain-timeout-s", type=float, default=30.0, help="A leaving replica's drain.")
    p.add_argument("--seed", type=int, default=5, help="Prompt seed.")
    p.add_argument(
        "--same-weights", action="store_true",
        help="--serve: upgrade to another max_num_seqs (the same weights and KV fingerprint: "
        "streams a leaving decode hands off continue from their pulled blocks) instead of "
        "other weights.",
    )  # fmt: skip
    p.add_argument(
        "--serve", action="store_true", help="Through a local Ray Serve cluster and the CLI."
    )
    return p.parse_args(argv)


def prompts(seed: int) -> list[list[int]]:
    """Long prompts (remote prefill) and short ones (local), token ids of the byte tokenizer."""
    rng = random.Random(seed)
    return [[rng.randrange(3, 250) for _ in range(n)] for n in (70, 90, 50, 40, 12, 20, 66)]


def fingerprint_of(worker: Worker) -> str:
    """The worker's KV fingerprint."""
    assert worker.kv_compat is not None
    return worker.kv_compat.fingerprint()


@dataclass
class Fleet:
    """The live replicas of both pools, placed by fingerprint like the Serve routers."""

    prefills: list[PrefillWorker] = field(default_factory=list)
    decodes: list[DecodeWorker] = field(default_factory=list)
    decoded_on: dict[str, str] = field(default_factory=dict)
    """Each request id's decode fingerprint."""
    _turn: itertools.count[int] = field(default_factory=itertools.count)

    def pick(self, workers: Sequence[Worker], fingerprint: str) -> Worker:
        """Round robin among the workers of ``fingerprint`` (all, when none has it)."""
        choices = of_fingerprint(list(workers), fingerprint, fingerprint_of)
        return choices[next(self._turn) % len(choices)]

    def decode_fingerprints(self) -> Mapping[str, int]:
        """``FleetVersions``: live decode replicas by fingerprint."""
        return count_fingerprints(self.decodes)

    def prefill_fingerprints(self) -> Mapping[str, int]:
        """``FleetVersions``: live prefill replicas by fingerprint."""
        return count_fingerprints(self.prefills)


def count_fingerprints(workers: Sequence[Worker]) -> dict[str, int]:
    """Workers by fingerprint."""
    counts: dict[str, int] = {}
    for worker in workers:
        counts[fingerprint_of(worker)] = counts.get(fingerprint_of(worker), 0) + 1
    return counts


@dataclass
class FleetPrefill:
    """``PrefillClient`` over the fleet."""

    fleet: Fleet

    async def prefill(self, request: PrefillRequest) -> PrefillResult:
        """On a live prefill of the request's fingerprint."""
        worker = self.fleet.pick(self.fleet.prefills, request.routing.kv_fingerprint)
        assert isinstance(worker, PrefillWorker)
        return await worker.prefill(request)

    def healthy(self) -> bool:
        """Some prefill replica is live."""
        return bool(self.fleet.prefills)


@dataclass
class FleetDecode:
    """``DecodeClient`` over the fleet."""

    fleet: Fleet

    def generate(self, request: DecodeRequest) -> AsyncIterator[TokenChunk]:
        """On a live decode of the request's fingerprint."""
        worker = self.fleet.pick(self.fleet.decodes, request.routing.kv_fingerprint)
        assert isinstance(worker, DecodeWorker)
        self.fleet.decoded_on[request.request_id] = fingerprint_of(worker)
        return worker.generate(request)

    def healthy(self) -> bool:
        """Some decode replica is live."""
        return bool(self.fleet.decodes)


@dataclass
class Outcome:
    """One request: its phase, TTFT, text and whether it failed."""

    phase: str
    ttft_s: float
    text: str
    failed: bool


async def stream_one(
    client: httpx.AsyncClient, prompt: list[int], max_tokens: int, phase: str
) -> Outcome:
    """One streamed completion."""
    body = {"model": SERVED, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}  # fmt: skip
    started_s, ttft_s, parts, failed = time.perf_counter(), 0.0, [], False
    async with client.stream("POST", "/v1/completions", json=body) as response:
        failed = response.status_code != 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                failed = True
                continue
            if not ttft_s:
                ttft_s = time.perf_counter() - started_s
            parts.append(event["choices"][0]["text"])
    return Outcome(phase, ttft_s, "".join(parts), failed)


def segments_of_this_process() -> set[str]:
    """This process's shared KV segments in ``/dev/shm``."""
    mark = f"-{os.getpid()}-"
    return {n for n in os.listdir(SHM_DIR) if n.startswith(NAME_PREFIX) and mark in n}


def live_segments(fleet: Fleet) -> set[str]:
    """The segments the live replicas hold."""
    names = {w.engine.engine.parts.storage.shared_region for w in [*fleet.prefills, *fleet.decodes]}
    return {n for n in names if n is not None}


async def retire(worker: Worker, drain_timeout_s: float) -> None:
    """A replica that left the fleet: drain what it still serves, then shut it down."""
    deadline_s = time.monotonic() + drain_timeout_s
    if isinstance(worker, PrefillWorker):
        await worker.drain(drain_timeout_s)
    while time.monotonic() < deadline_s:
        stats = worker.stats()
        if not (stats.num_running or stats.num_waiting or stats.imports_in_progress):
            break
        await asyncio.sleep(0.05)
    await worker.shutdown()


def build(role: str, model: ModelConfig) -> Worker:
    """A replica's worker from the real builder."""
    if role == "prefill":
        return build_prefill_worker(model, ENGINE, TRANSFER)
    return build_decode_worker(model, ENGINE, TRANSFER)


def references(
    models: Sequence[ModelConfig], all_prompts: list[list[int]], max_tokens: int
) -> set[str]:
    """Every version's own greedy output of every prompt (the offline ``LLM``)."""
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    texts: set[str] = set()
    for model in models:
        llm = LLM(model.name, max_model_len=512, kv_cache_memory_bytes=16 << 20)
        texts |= {
            o.text for o in llm.generate(prompt_token_ids=all_prompts, sampling_params=greedy)
        }
        llm.shutdown()
    return texts


async def run(args: argparse.Namespace, old: ModelConfig, new: ModelConfig) -> dict[str, Any]:
    """The upgrade under load; the JSON keys (see the module docstring)."""
    all_prompts = prompts(args.seed)
    expected = references([old, new], all_prompts, args.max_tokens)
    fleet = Fleet(
        [build("prefill", old) for _ in range(args.prefill)],  # type: ignore[misc]
        [build("decode", old) for _ in range(args.decode)],  # type: ignore[misc]
    )
    settings = IngressSettings(
        served_model_names=(SERVED,), max_model_len=512, block_size=ENGINE.block_size,
        hash_seed=ENGINE.hash_seed,
        disaggregation=DisaggregationConfig(local_prefill_threshold_tokens=THRESHOLD_TOKENS),
    )  # fmt: skip
    tokenizer = fleet.decodes[0].engine.engine.tokenizer
    endpoint = ModelEndpoint(
        tokenizer, FleetPrefill(fleet), FleetDecode(fleet), settings, versions=fleet
    )
    app = create_app([endpoint]).asgi
    outcomes: list[Outcome] = []
    phase = "before"
    stop = asyncio.Event()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://ingress", timeout=120
    ) as client:

        async def load(index: int) -> None:
            for i in itertools.count(index):
                if stop.is_set():
                    return
                prompt = all_prompts[i % len(all_prompts)]
                outcomes.append(await stream_one(client, prompt, args.max_tokens, phase))

        clients = [asyncio.create_task(load(i)) for i in range(args.clients)]
        while len(outcomes) < args.warmup_requests:
            await asyncio.sleep(0.05)
        phase, started_s, worst = "during", time.perf_counter(), 0.0
        replaced = (0, 0)
        for step in rolling_steps(args.prefill, args.decode):
            role = "prefill" if step.num_new_prefill > replaced[0] else "decode"
            pool: list[Any] = fleet.prefills if role == "prefill" else fleet.decodes
            joining = await asyncio.to_thread(build, role, new)
            leaving = next(w for w in pool if fingerprint_of(w) != fingerprint_of(joining))
            pool.append(joining)
            pool.remove(leaving)
            await retire(leaving, args.drain_timeout_s)
            replaced = (step.num_new_prefill, step.num_new_decode)
            for version in (fingerprint_of(leaving), fingerprint_of(joining)):
                p = count_fingerprints(fleet.prefills).get(version, 0)
                d = count_fingerprints(fleet.decodes).get(version, 0)
                worst = max(worst, ratio_deviation(p, d, args.prefill, args.decode))
        upgrade_s = time.perf_counter() - started_s
        phase = "after"
        stop.set()
        await asyncio.gather(*clients)
    left_after_upgrade = segments_of_this_process() - live_segments(fleet)
    for worker in [*fleet.prefills, *fleet.decodes]:
        await worker.shutdown()
    left_after_down = segments_of_this_process()
    before = [o.ttft_s for o in outcomes if o.phase == "before" and not o.failed]
    during = [o.ttft_s for o in outcomes if o.phase == "during" and not o.failed]
    return {
        "requests": len(outcomes),
        "requests_during": len(during),
        "requests_failed": sum(o.failed for o in outcomes),
        "mixed_version_outputs": sum(
            1 for o in outcomes if not o.failed and o.text not in expected
        ),
        "p99_ttft_before_ms": 1000 * _p99(before),
        "p99_ttft_during_ms": 1000 * _p99(during),
        "p99_ttft_during_over_before": _p99(during) / _p99(before) if before and during else None,
        "upgrade_s": round(upgrade_s, 2),
        "max_pd_ratio_deviation": worst,
        "shm_segments_left": len(left_after_upgrade) + len(left_after_down),
    }


def _p99(values: list[float]) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def main(argv: Sequence[str]) -> int:
    """Run once and print the JSON line."""
    args = parse_args(argv)
    if args.serve:
        return main_serve(args)
    with tempfile.TemporaryDirectory(prefix="pdserve-upgrade-") as directory:
        other = Path(directory) / "tiny-llama-other-weights"
        other.mkdir()
        write_checkpoint(dataclasses.replace(BUILTIN_SPECS["tiny-llama"], seed=4242), other)
        old, new = ModelConfig(name="builtin:tiny-llama"), ModelConfig(name=str(other))
        result = asyncio.run(run(args, old, new))
    print(json.dumps(result))
    return 0 if not result["requests_failed"] and not result["mixed_version_outputs"] else 1


def main_serve(args: argparse.Namespace) -> int:
    """The upgrade through Serve (``--serve``); prints the JSON line."""
    from benchmarks.serve_upgrade import Scenario, run_upgrade

    scenario = Scenario(
        other_weights=not args.same_weights, num_prefill=args.prefill, num_decode=args.decode,
        clients=args.clients, max_tokens=args.max_tokens,
        warmup_requests=args.warmup_requests, baseline_requests=args.baseline_requests,
        drain_timeout_s=args.drain_timeout_s, churn=not args.no_churn, seed=args.seed,
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pdserve-upgrade-serve-") as directory:
        result = run_upgrade(scenario, Path(directory))
    summary = result.summary()
    print(json.dumps(summary))
    clean = not summary["requests_failed"] and not summary["mixed_version_outputs"]
    return 0 if clean and summary["upgrade_rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
