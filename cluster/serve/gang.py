"""Expert-parallel pools as Ray Serve gangs: deployment options, rendezvous, rank engines.

A pool with ``expert_parallel: N`` (N > 1) deploys with Serve's ``gang_scheduling_config``:
replicas are scheduled, started and restarted N at a time (pack placement; a replica that dies
restarts its whole gang), and each replica sees its ``GangContext`` (gang id, rank, size).

Rendezvous: rank 0 picks ``tcp://<its node ip>:<free port>`` and publishes it on a small named
Ray actor keyed by application, deployment and gang id (0 CPUs, namespace ``pdserve``); the other
ranks poll it (bounded by ``ep_timeout_s``). Every rank then joins the gang's torch.distributed
process group, builds its own engine with its share of the experts and steps in lockstep
(:func:`engine.engine_builder.build_engine` with an expert-parallel gang). NOTE: the board is not
detached: its creator owns it, and every rank holds its handle until its join returned (by then
every rank has read the address), after which Ray removes the board by itself, also when a rank
dies mid-rendezvous. A restarted gang has a new gang id, hence a fresh board.

:class:`GangEngineFactory` is what the app builder hands a pool's deployment: picklable
settings whose :meth:`~GangEngineFactory.start` runs inside the replica.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve
from ray.serve.config import GangPlacementStrategy, GangRuntimeFailurePolicy, GangSchedulingConfig

from core.config import EngineConfig, EPLBConfig, ModelConfig, PoolConfig
from core.errors import ConfigError, UnavailableError
from core.kv_events import KVEventBatch
from engine.async_engine import AsyncEngine
from engine.engine_builder import ExpertParallelGang, build_async_engine
from engine.expert_parallel import join_process_group, rendezvous_address

logger = logging.getLogger(__name__)

GANG_NAMESPACE = "pdserve"
GANG_HEALTH_CHECK_PERIOD_S = 2.0
"""A rank whose gang broke turns unhealthy; check often so Serve restarts the gang soon."""
_POLL_S = 0.05


def gang_options(pool: PoolConfig) -> dict[str, Any]:
    """Extra ``Deployment.options(...)`` for an expert-parallel pool; empty for EP 1."""
    if pool.expert_parallel == 1:
        return {}
    return {
        "gang_scheduling_config": GangSchedulingConfig(
            gang_size=pool.expert_parallel,
            gang_placement_strategy=GangPlacementStrategy.PACK,
            runtime_failure_policy=GangRuntimeFailurePolicy.RESTART_GANG,
        ),
        "health_check_period_s": GANG_HEALTH_CHECK_PERIOD_S,
    }


class RendezvousBoard:
    """Holds one gang's rendezvous address until the ranks have read it (a Ray actor)."""

    def __init__(self) -> None:
        self._address: str | None = None

    def publish(self, address: str) -> None:
        """Rank 0: set the address."""
        self._address = address

    def address(self) -> str | None:
        """The address, or None before rank 0 published it."""
        return self._address


RendezvousBoardActor = ray.remote(num_cpus=0, max_restarts=0)(RendezvousBoard)


def board_name(app_name: str, deployment: str, gang_id: str) -> str:
    """The actor name of one gang's rendezvous board."""
    return f"pdserve-ep-{app_name or 'default'}-{deployment}-{gang_id}"


def open_board(name: str) -> Any:
    """The handle of board ``name``, created by whichever rank comes first. Hold it until the
    join returned: the board goes away with its creator's last handle."""
    return RendezvousBoardActor.options(
        name=name, namespace=GANG_NAMESPACE, get_if_exists=True
    ).remote()


def exchange_address(board: Any, rank: int, timeout_s: float) -> str:
    """Rank 0 publishes a fresh address on ``board``; other ranks wait for it.

    Raises :class:`UnavailableError` when nothing is published within ``timeout_s``.
    """
    if rank == 0:
        address = rendezvous_address(ray.util.get_node_ip_address())
        ray.get(board.publish.remote(address), timeout=timeout_s)
        return address
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = ray.get(board.address.remote(), timeout=timeout_s)
        if found is not None:
            return str(found)
        time.sleep(_POLL_S)  # a sync replica constructor: nothing else runs on this thread
    raise UnavailableError(f"gang rendezvous: rank 0 published no address in {timeout_s}s")


@dataclass(frozen=True)
class GangEngineFactory:
    """Picklable settings from the app builder: :meth:`start` makes a replica its gang's rank."""

    expert_parallel: int
    timeout_s: float
    eplb: EPLBConfig | None = None

    def start(
        self,
        model: ModelConfig,
        engine: EngineConfig,
        *,
        kv_event_callback: Callable[[KVEventBatch], None] | None = None,
    ) -> AsyncEngine:
        """Join this replica's gang and build its rank's engine (runs inside the replica)."""
        context = serve.get_replica_context()
        gang = context.gang_context
        if gang is None or gang.world_size != self.expert_parallel:
            raise ConfigError(
                f"expert_parallel {self.expert_parallel} needs a gang-scheduled deployment; this "
                f"replica's gang is {gang}",
                param="expert_parallel",
            )
        board = open_board(board_name(context.app_name, context.deployment, gang.gang_id))
        address = exchange_address(board, gang.rank, self.timeout_s)
        logger.info(
            "gang %s: rank %s/%s joining at %s", gang.gang_id, gang.rank, gang.world_size, address
        )
        collective = join_process_group(
            gang.rank, gang.world_size, address, timeout_s=self.timeout_s
        )
        del board  # every rank has joined: the board may go
        rank = ExpertParallelGang(collective, eplb=self.eplb)
        return build_async_engine(model, engine, gang=rank, kv_event_callback=kv_event_callback)


def gang_engine_factory(pool: PoolConfig) -> GangEngineFactory | None:
    """The factory a pool's deployment gets: None unless the pool is expert-parallel."""
    if pool.expert_parallel == 1:
        return None
    return GangEngineFactory(pool.expert_parallel, pool.ep_timeout_s, pool.eplb)
