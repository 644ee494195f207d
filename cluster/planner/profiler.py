"""``pdserve profile``'s measurements: one engine per role, the cluster's model and options.

Each role's engine is built exactly as its replicas build it (``ClusterConfig.engine_for``) on
this machine's device, so run the profile on a node of the pool's kind. Prompts are random
token ids, fresh for every request, so no measurement is a prefix-cache hit.

* Prefill: ``batch`` prompts of ``prompt_len`` tokens, each generating one token, from queueing
  to the last first token — the engine's own chunking under ``max_num_batched_tokens`` included.
* Decode: ``concurrency`` sequences of ``context_len`` prompt tokens; once every one of them has
  its first token, the median wall time of the following steps is the inter-token latency.

A point the engine cannot hold (KV blocks for every sequence, ``max_num_seqs``, the model's
context) is skipped, not squeezed in by preemption. Each point is measured ``repeats`` times and
the median kept; one throwaway run first warms the kernels.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import count

import numpy as np

from cluster.planner.capacity_model import CapacityModel, DecodePoint, PrefillPoint
from core.config import ClusterConfig
from core.sampling import SamplingParams
from engine.engine import LLMEngine
from engine.setup import build_engine_parts, pick_device


@dataclass(frozen=True)
class ProfileGrid:
    """Which points to measure."""

    prompt_lens: tuple[int, ...] = (32, 128, 512, 2048)
    batches: tuple[int, ...] = (1, 4)
    context_lens: tuple[int, ...] = (128, 1024)
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    decode_steps: int = 8
    repeats: int = 2


class _Probe:
    """One engine and fresh random prompts for it."""

    def __init__(self, engine: LLMEngine, seed: int) -> None:
        self.engine = engine
        self.vocab = engine.parts.arch.vocab_size
        self.capacity_tokens = _total_blocks(engine) * engine.scheduler.block_size
        self._rng = np.random.default_rng(seed)
        self._ids = count()

    def fits(self, num_seqs: int, tokens_each: int) -> bool:
        block = self.engine.scheduler.block_size
        blocks_each = -(-tokens_each // block)
        return (
            num_seqs <= self.engine.scheduler.max_num_seqs
            and tokens_each <= self.engine.max_model_len
            and num_seqs * blocks_each * block <= self.capacity_tokens
        )

    def submit(self, num_seqs: int, prompt_len: int, max_tokens: int) -> list[str]:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        ids = []
        for _ in range(num_seqs):
            request_id = f"profile-{next(self._ids)}"
            prompt = self._rng.integers(1, self.vocab, size=prompt_len).tolist()
            self.engine.add_request(request_id, prompt, params)
            ids.append(request_id)
        return ids

    def prefill_seconds(self, batch: int, prompt_len: int) -> float:
        started = time.perf_counter()
        self.submit(batch, prompt_len, max_tokens=1)
        while self.engine.has_unfinished():
            self.engine.step()
        return time.perf_counter() - started

    def decode_step_seconds(self, concurrency: int, context_len: int, steps: int) -> float:
        ids = self.submit(concurrency, context_len, max_tokens=steps + 2)
        started: set[str] = set()
        while len(started) < concurrency:  # prefill (chunked, maybe over several steps)
            started.update(o.request_id for o in self.engine.step() if o.outputs[0].token_ids)
        times = []
        for _ in range(steps):
            began = time.perf_counter()
            self.engine.step()
            times.append(time.perf_counter() - began)
        for request_id in ids:
            self.engine.abort(request_id)
        while self.engine.has_unfinished():
            self.engine.step()
        return statistics.median(times)


def profile(
    config: ClusterConfig,
    grid: ProfileGrid = ProfileGrid(),
    progress: Callable[[str], None] = lambda _: None,
) -> CapacityModel:
    """Measure prefill on the prefill pool's engine and decode on the decode pool's."""
    device = pick_device()
    prefill_engine = _engine(config, "prefill")
    same = config.engine_for("prefill") == config.engine_for("decode")
    decode_engine = prefill_engine if same else _engine(config, "decode")
    try:
        prefill = _prefill_points(_Probe(prefill_engine, config.primary.model.seed), grid, progress)
        decode = _decode_points(
            _Probe(decode_engine, config.primary.model.seed + 1), grid, progress
        )
    finally:
        prefill_engine.close()
        if decode_engine is not prefill_engine:
            decode_engine.close()
    name = torch_device_name(device)
    max_seqs = config.engine_for("decode").max_num_seqs
    return CapacityModel(config.primary.model.name, name, tuple(prefill), tuple(decode), max_seqs)


def _prefill_points(
    probe: _Probe, grid: ProfileGrid, progress: Callable[[str], None]
) -> list[PrefillPoint]:
    probe.prefill_seconds(1, grid.prompt_lens[0])  # warm-up
    points = []
    for length in grid.prompt_lens:
        for batch in grid.batches:
            if not probe.fits(batch, length + 1):
                continue
            seconds = _median(partial(probe.prefill_seconds, batch, length), grid.repeats)
            points.append(PrefillPoint(length, batch, seconds))
            progress(f"prefill {length} tokens x{batch}: {seconds * 1000:.1f} ms")
    return points


def _decode_points(
    probe: _Probe, grid: ProfileGrid, progress: Callable[[str], None]
) -> list[DecodePoint]:
    probe.decode_step_seconds(1, grid.context_lens[0], 2)  # warm-up
    points = []
    for context in grid.context_lens:
        for concurrency in grid.concurrencies:
            if not probe.fits(concurrency, context + grid.decode_steps + 2):
                continue
            measure = partial(probe.decode_step_seconds, concurrency, context, grid.decode_steps)
            seconds = _median(measure, grid.repeats)
            points.append(DecodePoint(concurrency, context, seconds))
            progress(f"decode {concurrency} seqs at {context} tokens: {seconds * 1000:.2f} ms")
    return points


def _engine(config: ClusterConfig, role: str) -> LLMEngine:
    return LLMEngine(build_engine_parts(config.primary.model, config.engine_for(role)))  # type: ignore[arg-type]


def _total_blocks(engine: LLMEngine) -> int:
    stats = engine.scheduler.stats()
    return stats.num_free_blocks + stats.num_used_blocks


def _median(measure: Callable[[], float], repeats: int) -> float:
    return statistics.median(measure() for _ in range(max(repeats, 1)))


def torch_device_name(device: object) -> str:
    """``cuda:NVIDIA H100 80GB HBM3`` or ``cpu``: what the profile was measured on."""
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        return f"cuda:{torch.cuda.get_device_name(0)}"
    return "cpu"


def default_grid(prompt_lens: Sequence[int] | None, max_len: int | None) -> ProfileGrid:
    """The default grid, optionally with other prompt lengths or a cap on every length."""
    grid = ProfileGrid()
    lens = tuple(prompt_lens) if prompt_lens else grid.prompt_lens
    if max_len is not None:
        lens = tuple(n for n in lens if n <= max_len) or (max_len,)
        contexts = tuple(n for n in grid.context_lens if n <= max_len) or (max_len,)
        return ProfileGrid(lens, grid.batches, contexts, grid.concurrencies)
    return ProfileGrid(lens, grid.batches, grid.context_lens, grid.concurrencies)
