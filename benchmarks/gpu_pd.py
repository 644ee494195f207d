"""The P/D data plane without Ray: a prefill process and a decode process on one machine.

Each process runs the roles' own worker (``build_prefill_worker`` / ``build_decode_worker``) with
its own engine and the real transports: the decode reaches the prefill's export server over gRPC
on loopback and takes one of its paths: moving the bytes over the wire (``grpc``,
``transfer.same_node: off``); reading them from the prefill's shared-memory host KV (``same_node``,
``host``: the stream carries locations and checksums); on CUDA also copying them device to device
out of the prefill's KV mapped over CUDA IPC (``cuda_ipc``, ``auto``: the stream carries block
ids). One decode engine serves every path's worker and the colocated peer (the decode prefills
the prompt itself).

For each prompt length, after a warm-up round, every round takes a fresh random prompt through
every mode on the same prompt (prefix caching off, so nothing is reused): colocated; each path
*sequential* (the prefill answers, then the decode pulls everything) and *pipelined* (the decode
starts on the prefill's open export and pulls each chunk's blocks while the next computes, as the
ingress does for prompts longer than one prefill chunk). Greedy tokens of every P/D mode must equal
the colocated ones. Per mode it records when the decode's first token (the request's second)
arrived, when the prefill finished, when the KV was in place on the decode, and the pull's bytes
and seconds (the importer's own metrics).

Last stdout line, one JSON object (medians over rounds, at the reference length ``--ref-tokens``):

- ``grpc_pull_gbps`` / ``same_node_pull_gbps``: a sequential pull's bytes over its seconds
  (handle to every block in the decode's KV), per path (GPU targets >= 10 / >= 100); the
  same-node keys are the fastest same-node path's (``same_node_path``: ``cuda_ipc`` on CUDA),
  ``host_shm_*`` the shared-memory path's;
- ``second_token_8k_grpc_ratio`` / ``second_token_8k_same_node_ratio``: time to the decode's
  first token, pipelined P/D over colocated (GPU targets <= 1.5 / <= 1.2);
- ``overlap_fraction`` (gRPC; ``overlap_fraction_same_node``): the share of the sequential pull's
  time that the pipelined run hid behind prefill, ``1 - exposed / pull`` with ``exposed`` the time
  from the prefill's answer to the KV in place (GPU target >= 0.8);
- ``rows``: every length and mode.

On CUDA the defaults are ``builtin:llama-1b`` in bf16 with 2K/8K/32K-token prompts (8K: 256 MiB
of KV) and 1024-token prefill chunks; elsewhere ``builtin:tiny-llama`` with short prompts, so the
same script runs (and is tested) on a CPU-only machine.

Usage: ``python benchmarks/gpu_pd.py [--lens 2048,8192,32768] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import multiprocessing as mp
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import torch

from core.codec import from_plain, to_plain
from core.config import EngineConfig, ModelConfig, TransferConfig
from core.kv_handle import KVHandle
from core.messages import DecodeRequest, PrefillRequest, PrefillResult, PrefillStarted, StageTimes
from core.sampling import SamplingParams

if TYPE_CHECKING:
    from decode.worker import DecodeWorker

logger = logging.getLogger("gpu_pd")

PATHS = ("grpc", "same_node")
"""The P/D paths everywhere: gRPC (``transfer.same_node: off``) and shared host memory
(``host``); on CUDA also ``cuda_ipc`` (``auto``: device to device)."""
CUDA_PATH = "cuda_ipc"
SAME_NODE_SETTING = {"grpc": "off", "same_node": "host", CUDA_PATH: "auto"}
MODES = ("colocated", *(f"{p}{s}" for p in PATHS for s in ("", "_pipelined")))
TARGETS = {
    "grpc_pull_gbps": (">=", 10.0),
    "same_node_pull_gbps": (">=", 100.0),
    "second_token_8k_grpc_ratio": ("<=", 1.5),
    "second_token_8k_same_node_ratio": ("<=", 1.2),
    "overlap_fraction": (">=", 0.8),
}
NEW_TOKENS = 3


@dataclass(frozen=True)
class Settings:
    """What both worker processes build, and the prompts the driver sends."""

    model: str
    dtype: str
    lens: tuple[int, ...]
    ref_tokens: int
    chunk_tokens: int
    kv_cache_bytes: int
    repeats: int
    vocab: int
    paths: tuple[str, ...] = PATHS

    def engine(self) -> EngineConfig:
        """Both engines: room for the longest prompt, chunked prefill, no prefix reuse."""
        return EngineConfig(
            max_model_len=max(self.lens) + 2 * NEW_TOKENS + self.chunk_tokens,
            kv_cache_memory_bytes=self.kv_cache_bytes,
            max_num_batched_tokens=self.chunk_tokens,
            enable_prefix_caching=False,
        )

    def model_config(self) -> ModelConfig:
        """The model both processes load."""
        return ModelConfig(name=self.model, dtype=self.dtype)


def transfer_config(path: str = CUDA_PATH) -> TransferConfig:
    """Loopback transfer config of both processes (long deadlines for 32K prompts); a decode
    worker's takes ``path`` (the prefill's, ``auto``, offers every one)."""
    return TransferConfig(
        bind_host="127.0.0.1",
        insecure_test_token="gpu-pd-benchmark",
        pull_deadline_s=300.0,
        rpc_deadline_s=60.0,
        same_node=SAME_NODE_SETTING[path],  # type: ignore[arg-type]
    )


def default_settings(cuda: bool, args: argparse.Namespace) -> Settings:
    """The GPU run, or a small CPU one; explicit arguments win."""
    lens: tuple[int, ...] = (2048, 8192, 32768) if cuda else (256, 1024, 2048)
    if args.lens:
        lens = tuple(int(n) for n in args.lens.split(","))
    ref = args.ref_tokens or (8192 if cuda else 1024)
    if ref not in lens:
        raise SystemExit(f"--ref-tokens {ref} is not one of the prompt lengths {lens}")
    return Settings(
        paths=(*PATHS, CUDA_PATH) if cuda else PATHS,
        model=args.model or ("builtin:llama-1b" if cuda else "builtin:tiny-llama"),
        dtype="bfloat16" if cuda else "float32",
        lens=lens,
        ref_tokens=ref,
        chunk_tokens=args.chunk_tokens or (1024 if cuda else 128),
        kv_cache_bytes=(8 << 30) if cuda else (96 << 20),
        repeats=args.repeats,
        vocab=30000 if cuda else 300,
    )


# -- the two worker processes ------------------------------------------------------------------


def prefill_main(conn: Connection, settings: Settings) -> None:
    """Serve ``("prefill", request, pipelined)`` until ``("stop",)``; answer each with an
    optional ``("started", handle, t)`` then ``("result", result, t)`` (``t``: monotonic)."""
    from prefill.build import build_prefill_worker

    async def serve() -> None:
        worker = build_prefill_worker(settings.model_config(), settings.engine(), transfer_config())
        conn.send(("ready", worker.engine.engine.parts.layout.bytes_per_token))
        try:
            while (message := await asyncio.to_thread(conn.recv))[0] == "prefill":
                request = from_plain(PrefillRequest, message[1])
                if not message[2]:
                    result = await worker.prefill(request)
                    conn.send(("result", to_plain(result), time.monotonic()))
                    continue
                async for update in worker.prefill_stream(request):
                    kind = "started" if isinstance(update, PrefillStarted) else "result"
                    plain = to_plain(update.kv_handle if kind == "started" else update)
                    conn.send((kind, plain, time.monotonic()))
        finally:
            await worker.shutdown()

    asyncio.run(serve())


@dataclass(frozen=True)
class Outcome:
    """What the decode process saw of one request (times: monotonic seconds)."""

    started_s: float
    token_times_s: tuple[float, ...]
    token_ids: tuple[int, ...]
    stage_times: StageTimes | None = None
    pull_bytes: int = 0
    pull_s: float = 0.0
    paths: tuple[str, ...] = ()
    """The paths whose pull counters moved (``grpc``, ``same_node``, ``cuda_ipc``)."""
    fallbacks: tuple[str, ...] = ()
    """Why a pull did not take the same-node path, if one did not."""
    error: str | None = None


def decode_main(conn: Connection, settings: Settings) -> None:
    """Serve ``("generate", request, mode_path)`` until ``("stop",)``, each answered with an
    :class:`Outcome`; ``mode_path``: ``local`` (colocated) or one of ``settings.paths``. One
    engine serves every path's worker."""
    from decode.build import build_decode_worker

    async def serve() -> None:
        model, engine = settings.model_config(), settings.engine()
        first, *others = settings.paths
        workers = {first: build_decode_worker(model, engine, transfer_config(first))}
        for path in others:
            workers[path] = build_decode_worker(
                model, engine, transfer_config(path), async_engine=workers[first].engine
            )
        workers["local"] = workers[first]
        conn.send(("ready", None))
        try:
            while (message := await asyncio.to_thread(conn.recv))[0] == "generate":
                outcome = await generate(workers[message[2]], from_plain(DecodeRequest, message[1]))
                conn.send(("done", to_plain(outcome)))
        finally:
            for path in settings.paths:
                await workers[path].shutdown()  # the later ones find the shared engine stopped

    asyncio.run(serve())


async def generate(worker: DecodeWorker, request: DecodeRequest) -> Outcome:
    """Run one decode stream, timing every token."""
    before = worker.stats().transfer
    started_s = time.monotonic()
    times: list[float] = []
    tokens: list[int] = []
    stage: StageTimes | None = None
    async for chunk in worker.generate(request):
        if chunk.error is not None:
            return Outcome(started_s, (), (), error=f"{chunk.error.kind}: {chunk.error.message}")
        if chunk.token_ids:
            times.extend([time.monotonic()] * len(chunk.token_ids))
            tokens.extend(chunk.token_ids)
        stage = stage or chunk.stage_times
    after = worker.stats().transfer
    return Outcome(
        started_s,
        tuple(times),
        tuple(tokens),
        stage,
        after.bytes_total - before.bytes_total,
        after.seconds_total - before.seconds_total,
        moved(before.pulls_by_path, after.pulls_by_path),
        moved(before.same_node_fallbacks_by_reason, after.same_node_fallbacks_by_reason),
    )


def moved(before: dict[str, int], after: dict[str, int]) -> tuple[str, ...]:
    """The labels whose counters grew."""
    return tuple(sorted(k for k, v in after.items() if v > before.get(k, 0)))


# -- the driver --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One request in one mode (seconds from the driver sending the prompt)."""

    prompt_tokens: int
    mode: str
    second_token_s: float
    tokens: tuple[int, ...]
    prefill_done_s: float | None = None
    kv_ready_s: float | None = None
    pull_bytes: int = 0
    pull_s: float = 0.0


@dataclass
class Driver:
    """Sends each request to the two worker processes and assembles its :class:`Run`."""

    prefill: Connection
    decode: Connection
    paths: tuple[str, ...] = PATHS
    params: SamplingParams = field(
        default_factory=lambda: SamplingParams(
            max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True
        )
    )

    def _decode(self, request: DecodeRequest, path: str) -> Outcome:
        self.decode.send(("generate", to_plain(request), path))
        _, plain = self.decode.recv()
        outcome = from_plain(Outcome, plain)
        if outcome.error is not None:
            raise RuntimeError(f"{request.request_id}: {outcome.error}")
        return outcome

    def colocated(self, request_id: str, prompt: list[int]) -> Run:
        """The decode prefills the prompt itself."""
        start_s = time.monotonic()
        out = self._decode(DecodeRequest(request_id, prompt, self.params), "local")
        return Run(len(prompt), "colocated", out.token_times_s[1] - start_s, out.token_ids)

    def disaggregated(self, request_id: str, prompt: list[int], path: str, pipelined: bool) -> Run:
        """Prefill in the prefill process, decode after a pull on ``path``; pipelined, the decode
        starts on the open export before the prefill answers."""
        start_s = time.monotonic()
        request = PrefillRequest(request_id, prompt, self.params)
        self.prefill.send(("prefill", to_plain(request), pipelined))
        kind, plain, done_s = self.prefill.recv()
        if kind == "started":
            handle = from_plain(KVHandle, plain)
            continued = DecodeRequest(request_id, prompt, self.params, kv_handle=handle)
            self.decode.send(("generate", to_plain(continued), path))
            kind, plain, done_s = self.prefill.recv()
            result = from_plain(PrefillResult, plain)
            out = self._outcome(request_id)
        else:
            result = from_plain(PrefillResult, plain)
            continued = DecodeRequest(
                request_id,
                prompt,
                self.params,
                first_token_id=result.first_token_id,
                kv_handle=result.kv_handle,
                prompt_chunk_ends=result.prompt_chunk_ends,
            )
            self.decode.send(("generate", to_plain(continued), path))
            out = self._outcome(request_id)
        if out.stage_times is None:
            raise RuntimeError(f"{request_id}: the decode imported no KV")
        if out.paths != (path,):  # e.g. /dev/shm too small for the prefill's KV: say so
            raise RuntimeError(
                f"{request_id}: pulled over {out.paths} instead of {path} "
                f"(same-node fallbacks: {out.fallbacks or 'none'})"
            )
        return Run(
            len(prompt),
            f"{path}_pipelined" if pipelined else path,
            out.token_times_s[0] - start_s,
            (result.first_token_id, *out.token_ids),
            prefill_done_s=done_s - start_s,
            kv_ready_s=out.started_s + out.stage_times.transfer_s - start_s,
            pull_bytes=out.pull_bytes,
            pull_s=out.pull_s,
        )

    def round(self, request_id: str, prompt: list[int]) -> list[Run]:
        """The prompt through every mode; P/D tokens must equal the colocated ones."""
        runs = [self.colocated(f"{request_id}-colocated", prompt)]
        for path in self.paths:
            for pipelined in (False, True):
                tag = f"{request_id}-{path}-{'pipelined' if pipelined else 'sequential'}"
                runs.append(self.disaggregated(tag, prompt, path, pipelined))
        for run in runs[1:]:
            if run.tokens != runs[0].tokens:
                raise RuntimeError(
                    f"{run.mode} at {len(prompt)} tokens: {run.tokens} != colocated "
                    f"{runs[0].tokens}"
                )
        return runs

    def _outcome(self, request_id: str) -> Outcome:
        _, plain = self.decode.recv()
        outcome = from_plain(Outcome, plain)
        if outcome.error is not None:
            raise RuntimeError(f"{request_id}: {outcome.error}")
        return outcome


# -- the report --------------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def overlap(pipelined: Run, pull_s: float) -> float:
    """The share of a ``pull_s`` pull that ``pipelined`` hid behind its prefill."""
    assert pipelined.kv_ready_s is not None and pipelined.prefill_done_s is not None
    exposed_s = max(0.0, pipelined.kv_ready_s - pipelined.prefill_done_s)
    return min(1.0, max(0.0, 1.0 - exposed_s / pull_s)) if pull_s > 0 else 1.0


def summarize(runs: Sequence[Run], ref_tokens: int) -> dict[str, Any]:
    """Medians per length and mode, and the headline keys at ``ref_tokens``."""
    rows: list[dict[str, Any]] = []
    by: dict[tuple[int, str], list[Run]] = {}
    for run in runs:
        by.setdefault((run.prompt_tokens, run.mode), []).append(run)
    for (tokens, mode), group in sorted(by.items()):
        row: dict[str, Any] = {
            "prompt_tokens": tokens,
            "mode": mode,
            "second_token_ms": round(_median([r.second_token_s for r in group]) * 1e3, 2),
        }
        if mode != "colocated":
            row["prefill_done_ms"] = round(_median([r.prefill_done_s or 0 for r in group]) * 1e3, 2)
            row["kv_ready_ms"] = round(_median([r.kv_ready_s or 0 for r in group]) * 1e3, 2)
            row["pull_mib"] = round(_median([r.pull_bytes for r in group]) / 2**20, 2)
        if mode in (*PATHS, CUDA_PATH):  # a pipelined pull also waits for the prefill
            row["pull_gbps"] = round(_median([r.pull_bytes / r.pull_s / 1e9 for r in group]), 3)
        rows.append(row)

    def second(mode: str) -> float:
        return _median([r.second_token_s for r in by[(ref_tokens, mode)]])

    def pull_gbps(path: str) -> float:
        group = by[(ref_tokens, path)]
        return round(_median([r.pull_bytes / r.pull_s / 1e9 for r in group]), 3)

    def overlaps(path: str) -> float:
        pull_s = _median([r.pull_s for r in by[(ref_tokens, path)]])
        return round(
            _median([overlap(r, pull_s) for r in by[(ref_tokens, f"{path}_pipelined")]]), 3
        )

    colocated = second("colocated")
    # the same-node keys take the fastest same-node path measured: device to device on CUDA
    fast = CUDA_PATH if (ref_tokens, CUDA_PATH) in by else "same_node"
    result: dict[str, Any] = {
        "ref_prompt_tokens": ref_tokens,
        "same_node_path": fast,
        "grpc_pull_gbps": pull_gbps("grpc"),
        "same_node_pull_gbps": pull_gbps(fast),
        "host_shm_pull_gbps": pull_gbps("same_node"),
        "second_token_8k_grpc_ratio": round(second("grpc_pipelined") / colocated, 3),
        "second_token_8k_same_node_ratio": round(second(f"{fast}_pipelined") / colocated, 3),
        "second_token_8k_host_shm_ratio": round(second("same_node_pipelined") / colocated, 3),
        "second_token_8k_grpc_sequential_ratio": round(second("grpc") / colocated, 3),
        "second_token_8k_same_node_sequential_ratio": round(second(fast) / colocated, 3),
        "overlap_fraction": overlaps("grpc"),
        "overlap_fraction_same_node": overlaps(fast),
    }
    result["targets_met"] = {
        key: (result[key] <= target if op == "<=" else result[key] >= target)
        for key, (op, target) in TARGETS.items()
    }
    result["rows"] = rows
    return result


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (every default depends on whether CUDA is there)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="default: builtin:llama-1b on CUDA, tiny-llama elsewhere")
    parser.add_argument("--lens", help="prompt lengths, comma-separated")
    parser.add_argument("--ref-tokens", type=int, help="the length the headline keys use")
    parser.add_argument("--chunk-tokens", type=int, help="max_num_batched_tokens of both engines")
    parser.add_argument("--repeats", type=int, default=3, help="measured rounds per length")
    parser.add_argument("--seed", type=int, default=7, help="prompt tokens' seed")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Start both worker processes, run every round and print one JSON line."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(message)s")
    cuda = torch.cuda.is_available()
    settings = default_settings(cuda, args)
    context = mp.get_context("spawn")
    ends = {name: context.Pipe() for name in ("prefill", "decode")}
    processes = [
        context.Process(target=target, args=(ends[name][1], settings), daemon=True)
        for name, target in (("prefill", prefill_main), ("decode", decode_main))
    ]
    for process in processes:
        process.start()
    for _, child_end in ends.values():
        child_end.close()  # a dead child now ends recv() with EOFError
    driver = Driver(ends["prefill"][0], ends["decode"][0], settings.paths)
    try:
        _, bytes_per_token = driver.prefill.recv()
        driver.decode.recv()
        rng = random.Random(args.seed)
        runs: list[Run] = []
        for length in settings.lens:
            for repeat in range(settings.repeats + 1):  # the first round warms up
                prompt = [rng.randrange(3, settings.vocab) for _ in range(length)]
                measured = driver.round(f"pd-{length}-{repeat}", prompt)
                if repeat:
                    runs.extend(measured)
                print(json.dumps([dataclass_row(r) for r in measured]), file=sys.stderr)
    finally:
        for end, _ in ends.values():
            with contextlib.suppress(OSError):  # a child that died has closed its end
                end.send(("stop",))
        for process in processes:
            process.join(timeout=120)
    result = {
        "benchmark": "gpu_pd",
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "model": settings.model,
        "dtype": settings.dtype,
        "chunk_tokens": settings.chunk_tokens,
        "kv_bytes_per_token": bytes_per_token,
        "repeats": settings.repeats,
        **summarize(runs, settings.ref_tokens),
    }
    print(json.dumps(result))


def dataclass_row(run: Run) -> dict[str, Any]:
    """One run for the progress log."""
    return {"tokens": run.prompt_tokens, "mode": run.mode, "second_ms": run.second_token_s * 1e3}


if __name__ == "__main__":
    main()
