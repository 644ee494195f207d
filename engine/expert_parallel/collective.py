"""The collectives an expert-parallel gang needs, and their ``torch.distributed`` implementation.

:class:`EPCollective` is the contract the EP MoE layer and the lockstep stepper are written
against: an uneven all-to-all of rows along dim 0 and an element-wise max all-reduce of a few
ints. Every rank must issue the same calls in the same order.
:class:`TorchProcessGroupCollective` runs them over a ``torch.distributed`` process group (gloo on
CPU, NCCL on CUDA); it also runs a tensor-parallel gang's sums and gathers
(:class:`~engine.models.tp_shard.TPCollective`), so nothing in it is EP-specific.
:mod:`engine.expert_parallel.thread_collective` runs them between threads of one process for
tests.

Failure: a collective that fails (a peer died: gloo reports the closed connection at once; a
peer stalled: the process group's timeout fires) raises :class:`UnavailableError` and marks the
collective broken, so every later call fails at once instead of touching a dead group. The gang
must then be restarted as a whole. NOTE: with NCCL a stalled peer is caught by NCCL's watchdog
(``TORCH_NCCL_ASYNC_ERROR_HANDLING``), which tears the process down rather than raising here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import torch
import torch.distributed as dist

from core.errors import UnavailableError

logger = logging.getLogger(__name__)


class EPCollective(Protocol):
    """Collectives over the ranks of one expert-parallel gang."""

    @property
    def rank(self) -> int:
        """This process's rank, ``0..world_size-1``."""
        ...

    @property
    def world_size(self) -> int:
        """The number of ranks in the gang."""
        ...

    def all_to_all(
        self, send: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int]
    ) -> torch.Tensor:
        """Send ``send`` [N, ...] rows ``sum(send_splits[:r])`` onwards (``send_splits[r]`` of
        them) to rank ``r``; return the rows received [sum(recv_splits), ...], grouped by source
        rank in rank order. ``recv_splits[r]`` must equal rank ``r``'s ``send_splits[self]``."""
        ...

    def all_reduce_max(self, values: Sequence[int]) -> list[int]:
        """Element-wise maximum of ``values`` over all ranks (same length on every rank)."""
        ...

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over all ranks, in place (tensor parallelism's row-parallel layers)."""
        ...

    def all_gather_last(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` [..., n] concatenated along the last dim in rank order."""
        ...

    def close(self) -> None:
        """Leave the gang; later calls raise :class:`UnavailableError`."""
        ...


class TorchProcessGroupCollective:
    """A ``torch.distributed`` process group as a gang's collective: :class:`EPCollective` and
    :class:`~engine.models.tp_shard.TPCollective` alike.

    ``device`` is where the group's tensors must live: the CPU for gloo, the rank's GPU for NCCL.
    ``owns_group``: :meth:`close` destroys the group (it was created for this gang).
    """

    def __init__(
        self,
        group: dist.ProcessGroup,
        device: torch.device,
        *,
        owns_group: bool = False,
    ) -> None:
        self._group = group
        self.device = device
        self._rank = dist.get_rank(group)
        self._world_size = dist.get_world_size(group)
        self._owns_group = owns_group
        self._broken: str | None = None

    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        return self._rank

    @property
    def world_size(self) -> int:
        """The group's size."""
        return self._world_size

    def all_to_all(
        self, send: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int]
    ) -> torch.Tensor:
        """Uneven all-to-all of rows (``all_to_all_single``); see :class:`EPCollective`."""
        self._check_usable("all_to_all")
        if self._world_size == 1:
            return send  # a gang of one: nothing to exchange
        recv = send.new_empty((sum(recv_splits), *send.shape[1:]))  # [M, ...]
        try:
            dist.all_to_all_single(
                recv,
                send.contiguous(),
                output_split_sizes=list(recv_splits),
                input_split_sizes=list(send_splits),
                group=self._group,
            )
        except RuntimeError as e:  # DistBackendError is a RuntimeError
            raise self._fail("all_to_all", e) from e
        return recv

    def all_reduce_max(self, values: Sequence[int]) -> list[int]:
        """Element-wise max of a few ints over the group."""
        self._check_usable("all_reduce")
        if self._world_size == 1:
            return list(values)
        tensor = torch.tensor(list(values), dtype=torch.int64, device=self.device)  # [n]
        try:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._group)
        except RuntimeError as e:
            raise self._fail("all_reduce", e) from e
        return [int(v) for v in tensor.tolist()]

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        """In-place sum over the group (``dist.all_reduce``)."""
        self._check_usable("all_reduce")
        if self._world_size == 1:
            return
        try:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self._group)
        except RuntimeError as e:
            raise self._fail("all_reduce", e) from e

    def all_gather_last(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenation along the last dim of every rank's tensor (``dist.all_gather``)."""
        self._check_usable("all_gather")
        if self._world_size == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self._world_size)]
        try:
            dist.all_gather(parts, tensor.contiguous(), group=self._group)
        except RuntimeError as e:
            raise self._fail("all_gather", e) from e
        return torch.cat(parts, dim=-1)

    def close(self) -> None:
        """Destroy the group if this collective created it; idempotent.

        NOTE: a group whose collective failed is left alone: destroying a gloo group after a
        timed-out or torn collective can block for the whole timeout or abort the process, and a
        broken gang's processes are restarted anyway.
        """
        failed = self._broken not in (None, "closed")
        if self._broken is None:
            self._broken = "closed"
        if self._owns_group and dist.is_initialized():
            self._owns_group = False
            if not failed:
                dist.destroy_process_group(self._group)

    def _check_usable(self, op: str) -> None:
        if self._broken is not None:
            raise UnavailableError(
                f"gang rank {self._rank}: {op} on a gang that is {self._broken}; "
                "the gang must be restarted"
            )

    def _fail(self, op: str, error: Exception) -> UnavailableError:
        self._broken = "broken"
        logger.error("gang rank %s: %s failed: %s", self._rank, op, error)
        return UnavailableError(
            f"gang rank {self._rank}: {op} failed, a peer rank died or stalled: {error}"
        )
