"""Forming an expert-parallel gang's process group: rendezvous address, backend, timeout.

Rank 0 picks an address (:func:`rendezvous_address`) and publishes it out of band (the Serve
gang does that); every rank then calls :func:`join_process_group` with it. The backend follows
the device: gloo on the CPU, NCCL on CUDA. ``timeout_s`` bounds every collective, so a rank
that stalls makes its peers fail within that time (a rank that dies is noticed at once).
"""

from __future__ import annotations

import datetime
import logging
import socket

import torch
import torch.distributed as dist

from core.errors import ConfigError, UnavailableError
from engine.expert_parallel.collective import TorchProcessGroupCollective

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 60.0


def rendezvous_address(host: str = "127.0.0.1") -> str:
    """``tcp://host:port`` with a port free on ``host`` right now (for rank 0 to publish)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port = sock.getsockname()[1]
    return f"tcp://{host}:{port}"


def backend_for(device: torch.device) -> str:
    """``nccl`` for a CUDA device, ``gloo`` otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def join_process_group(
    rank: int,
    world_size: int,
    init_method: str,
    *,
    device: torch.device | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> TorchProcessGroupCollective:
    """Join the gang at ``init_method`` (``tcp://host:port`` or ``file:///path``) as ``rank``.

    Creates the default process group of this process (one gang per process). Raises
    :class:`ConfigError` for a bad rank or world size and :class:`UnavailableError` when the
    rendezvous does not complete within ``timeout_s``.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} outside 0..{world_size - 1}", param="rank")
    if dist.is_initialized():
        raise ConfigError("this process already belongs to a process group", param="rank")
    device = device or torch.device("cpu")
    backend = backend_for(device)
    try:
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
    except (RuntimeError, ValueError) as e:  # DistStoreError (timeout) is a RuntimeError
        raise UnavailableError(
            f"gang rank {rank}/{world_size}: rendezvous at {init_method} failed: {e}"
        ) from e
    logger.info(
        "gang rank %s/%s joined %s (%s, timeout %.1fs)",
        rank,
        world_size,
        init_method,
        backend,
        timeout_s,
    )
    group = dist.group.WORLD
    if group is None:  # pragma: no cover - init_process_group just set it
        raise UnavailableError("torch.distributed has no default group after init")
    return TorchProcessGroupCollective(group, device, owns_group=True)
