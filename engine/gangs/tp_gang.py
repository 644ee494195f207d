"""A tensor-parallel gang of local processes: rank 0 in the caller, ranks 1.. started by it.

:func:`start_gang` is what ``LLM(model, tensor_parallel_size=N)`` runs: it starts N-1 follower
processes (``python -m engine.gangs.tp_follower``: a fresh interpreter each, no forked torch
state, and the caller's script is not imported again as ``multiprocessing``'s spawn would), joins
them in a process group (gloo on the CPU, NCCL on CUDA, one GPU per rank) and a gloo control
group, and returns the :class:`Gang`. Each follower builds its rank's engine parts from the same
configs (passed as JSON), agrees with the others on the KV cache (:func:`agree_on_kv`), then
runs :func:`~engine.gangs.tp_step.follow_leader` until rank 0 stops it (:meth:`Gang.close`)
or the gang breaks; a follower whose leader died sees its broadcast fail and exits.

A follower keeps the host bytes of its KV in named shared memory and tells rank 0 the name
(:func:`exchange_regions`); rank 0 maps every follower's (:attr:`LeaderRunner.rank_storages`),
so the one transfer server and client of a replica move each rank's heads between gangs.
"""

from __future__ import annotations

import datetime
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from core.config import EngineConfig, ModelConfig
from core.errors import ConfigError, UnavailableError
from core.kv_events import KVEventBatch
from engine.builtin import resolve_model
from engine.engine import LLMEngine
from engine.expert_parallel.collective import TorchProcessGroupCollective
from engine.expert_parallel.process_group import join_process_group, rendezvous_address
from engine.gangs.tp_step import BroadcastChannel, LeaderRunner, follow_leader
from engine.kv.storage import KVStorage
from engine.model_runner import ModelRunner
from engine.models import ModelArchConfig
from engine.models.tp_shard import TPShard
from engine.models.tp_split import check_tensor_parallel
from engine.setup import EngineParts, build_engine_parts, pick_device

logger = logging.getLogger(__name__)

CONTROL_TIMEOUT = datetime.timedelta(days=1)
"""How long a follower waits for the next step: as long as the leader may stay idle."""
JOIN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class GangMember:
    """One rank's place in its gang: its shard of the model and the control channel."""

    shard: TPShard
    collective: TorchProcessGroupCollective
    channel: BroadcastChannel
    control: dist.ProcessGroup


class Gang:
    """Rank 0's handle on its local gang: the member, and the follower processes it started."""

    def __init__(self, member: GangMember, processes: list[subprocess.Popen[bytes]]) -> None:
        self.member = member
        self.processes = processes
        self._closed = False

    def close(self) -> None:
        """Stop the followers, wait for them, leave the groups; idempotent. A follower still
        alive after ``JOIN_TIMEOUT_S`` (or one the stop could not reach) is killed."""
        if self._closed:
            return
        try:
            self.member.channel.send(None)
        except UnavailableError as e:
            logger.warning("tensor-parallel gang: stop not delivered (%s)", e)
        self._end(JOIN_TIMEOUT_S)

    def abort(self) -> None:
        """Kill the followers at once (rank 0 failed mid-build or mid-step: they may be inside
        a collective that will never complete); idempotent."""
        if not self._closed:
            self._end(0.0)

    def _end(self, wait_s: float) -> None:
        self._closed = True
        for process in self.processes:
            try:
                process.wait(wait_s)
            except subprocess.TimeoutExpired:
                if wait_s:
                    logger.warning("tensor-parallel follower pid %s did not stop", process.pid)
                process.kill()
                process.wait()
        self.member.collective.close()


def start_gang(model_cfg: ModelConfig, engine_cfg: EngineConfig) -> Gang:
    """Spawn ranks 1..N-1 of a ``tensor_parallel_size`` gang and join it as rank 0."""
    size = engine_cfg.tensor_parallel_size
    if size < 2:
        raise ConfigError(f"a gang needs tensor_parallel_size >= 2, got {size}", param="rank")
    init_method = rendezvous_address()
    package_root = str(Path(__file__).resolve().parents[2])  # the directory holding engine/
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p),
    }
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "engine.gangs.tp_follower",
                model_cfg.model_dump_json(),
                engine_cfg.model_dump_json(),
                init_method,
                str(rank),
            ],
            env=env,
        )
        for rank in range(1, size)
    ]
    try:
        member = join_gang(0, size, init_method)
    except BaseException:
        for started in processes:
            started.kill()
            started.wait()
        raise
    return Gang(member, processes)


def join_gang(rank: int, size: int, init_method: str) -> GangMember:
    """Join the gang at ``init_method`` as ``rank``: the model's process group and the control
    group (every rank calls this, in any order)."""
    collective = join_process_group(rank, size, init_method, device=pick_device(rank))
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return GangMember(
        TPShard(rank, size, collective), collective, BroadcastChannel(control, rank), control
    )


_REGION_WORDS = 64
"""int64 words carrying one rank's shared-memory segment name (names are under 60 bytes)."""


def exchange_regions(member: GangMember, mine: str | None) -> list[str]:
    """Every rank's KV segment name, in rank order ("" for a rank whose KV is private).
    Collective on the control group."""
    data = (mine or "").encode()
    if len(data) > _REGION_WORDS:
        raise ConfigError(f"shared KV segment name {mine!r} is too long", param="rank")
    words = torch.zeros(_REGION_WORDS + 1, dtype=torch.int64)
    words[0] = len(data)
    words[1 : 1 + len(data)] = torch.tensor(list(data), dtype=torch.int64)
    gathered = [torch.zeros_like(words) for _ in range(member.shard.size)]
    try:
        dist.all_gather(gathered, words, group=member.control)
    except RuntimeError as e:
        raise UnavailableError(f"tensor-parallel rank {member.shard.rank}: {e}") from e
    return [bytes(w[1 : 1 + int(w[0])].tolist()).decode() for w in gathered]


def map_followers(runner: LeaderRunner, regions: list[str]) -> None:
    """Map ranks 1..'s KV into rank 0 as :attr:`LeaderRunner.follower_storages` (left empty,
    logged, when a follower's KV is private: such a gang cannot exchange KV with a pool)."""
    if not all(regions[1:]):
        logger.warning("tensor-parallel followers' KV is not in shared memory: no KV transfer")
        return
    layout, num_blocks = runner.storage.layout, runner.storage.num_blocks
    runner.follower_storages = tuple(
        KVStorage(replace(layout, tp_rank=rank), num_blocks, torch.device("cpu"), attach=name)
        for rank, name in enumerate(regions[1:], start=1)
    )


def agree_on_kv(member: GangMember, parts: EngineParts) -> None:
    """Every rank checks that the gang sized the same KV cache for the same layout (rank aside);
    :class:`ConfigError` naming both when not. Collective on the control group."""
    rank_free = replace(parts.layout, tp_rank=0)
    digest = int(rank_free.fingerprint()[:15], 16)  # fits an int64
    mine = torch.tensor(
        [parts.storage.num_blocks, -parts.storage.num_blocks, digest, -digest], dtype=torch.int64
    )
    try:
        dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=member.control)
    except RuntimeError as e:
        raise UnavailableError(f"tensor-parallel rank {member.shard.rank}: {e}") from e
    most_blocks, fewest_blocks = int(mine[0]), -int(mine[1])
    if most_blocks != fewest_blocks:
        raise ConfigError(
            f"tensor-parallel ranks sized different KV caches ({fewest_blocks} to "
            f"{most_blocks} blocks): give every rank the same kv_cache_memory_bytes",
            param="kv_cache_memory_bytes",
        )
    if int(mine[2]) != -int(mine[3]):
        raise ConfigError(
            "tensor-parallel ranks built different KV layouts (model, dtype or block size)",
            param="tensor_parallel_size",
        )


def run_follower(model_json: str, engine_json: str, init_method: str, rank: int) -> None:
    """Rank ``rank``'s life: join, build, agree, follow rank 0 until it stops or the gang
    breaks (``python -m engine.gangs.tp_follower`` runs it)."""
    engine_cfg = EngineConfig.model_validate_json(engine_json)
    member = join_gang(rank, engine_cfg.tensor_parallel_size, init_method)
    parts: EngineParts | None = None
    try:
        parts = build_engine_parts(
            ModelConfig.model_validate_json(model_json), engine_cfg, tp=member.shard, shared_kv=True
        )
        agree_on_kv(member, parts)
        exchange_regions(member, parts.storage.shared_region)
        runner = ModelRunner(
            parts.model,
            parts.storage,
            graph_batch_sizes=parts.cuda_graph_batch_sizes,
            max_model_len=parts.scheduler.max_model_len,
        )
        follow_leader(runner, member.channel)
    finally:
        if parts is not None:
            parts.storage.close()
        member.collective.close()


def build_tp_engine(
    model_cfg: ModelConfig,
    engine_cfg: EngineConfig,
    *,
    kv_event_callback: Callable[[KVEventBatch], None] | None = None,
    shared_kv: bool = False,
) -> LLMEngine:
    """Rank 0's engine of a local gang of ``engine_cfg.tensor_parallel_size`` ranks, the
    followers started; closing the engine stops them. A model the size does not split is
    refused (:class:`ConfigError`) before any process starts; a failure while building kills
    the followers."""
    arch = ModelArchConfig.from_dir(resolve_model(model_cfg.name))
    check_tensor_parallel(arch, engine_cfg.tensor_parallel_size)
    gang = start_gang(model_cfg, engine_cfg)
    try:
        parts = build_engine_parts(
            model_cfg,
            engine_cfg,
            kv_event_callback=kv_event_callback,
            shared_kv=shared_kv,
            tp=gang.member.shard,
        )
        agree_on_kv(gang.member, parts)
        regions = exchange_regions(gang.member, parts.storage.shared_region)
        runner = LeaderRunner(
            parts.model,
            parts.storage,
            gang.member.channel,
            graph_batch_sizes=parts.cuda_graph_batch_sizes,
            max_model_len=parts.scheduler.max_model_len,
            gang=gang,
        )
        map_followers(runner, regions)
        parts.scheduler.reach_tp_ranks(  # rank 0's tiers hold every rank's share of a block
            [storage.block_bytes_view() for storage in runner.follower_storages]
        )
        return LLMEngine(parts, runner=runner)
    except BaseException:
        gang.abort()
        raise
