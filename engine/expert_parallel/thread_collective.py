"""An in-process :class:`~engine.expert_parallel.collective.EPCollective`: ranks are threads.

Used to run several simulated ranks of a gang in one process (unit tests, numerics checks):
each thread holds :meth:`InProcGroup.member` ``(rank)`` and calls the collectives exactly as a
real rank would. A collective posts this rank's contribution on a shared board, waits at a
barrier for every rank, reads what it needs and waits again so the board can be reused. The
barrier's timeout plays the process group's timeout: a rank that never arrives (or a rank that
calls :meth:`InProcCollective.close`) makes the others raise :class:`UnavailableError`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch

from core.errors import UnavailableError


class InProcGroup:
    """Shared state of ``world_size`` thread ranks; ``timeout_s`` bounds every collective."""

    def __init__(self, world_size: int, *, timeout_s: float = 10.0) -> None:
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size, timeout=timeout_s)
        self._board: list[Any] = [None] * world_size

    def member(self, rank: int) -> InProcCollective:
        """The collective handle of ``rank``."""
        return InProcCollective(self, rank)

    def exchange(self, rank: int, item: Any) -> list[Any]:
        """Post ``item`` for ``rank``; return every rank's item, in rank order."""
        self._wait(rank)  # the board is free: everyone finished reading the previous round
        self._board[rank] = item
        self._wait(rank)  # everyone posted
        return list(self._board)

    def abort(self) -> None:
        """Break the barrier: every waiting and future collective raises."""
        self._barrier.abort()

    def _wait(self, rank: int) -> None:
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError as e:
            raise UnavailableError(
                f"expert-parallel rank {rank}: in-process collective failed, a peer rank left "
                "or timed out"
            ) from e


class InProcCollective:
    """One thread rank's view of an :class:`InProcGroup`."""

    def __init__(self, group: InProcGroup, rank: int) -> None:
        self._group = group
        self._rank = rank

    @property
    def rank(self) -> int:
        """This thread's rank."""
        return self._rank

    @property
    def world_size(self) -> int:
        """The number of thread ranks."""
        return self._group.world_size

    def all_to_all(
        self, send: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int]
    ) -> torch.Tensor:
        """Uneven all-to-all of rows; see
        :class:`~engine.expert_parallel.collective.EPCollective`."""
        chunks = list(send.split(list(send_splits)))  # world_size x [n_r, ...]
        posted = self._group.exchange(self._rank, chunks)
        received = [rank_chunks[self._rank] for rank_chunks in posted]
        got = [int(c.shape[0]) for c in received]
        if got != list(recv_splits):
            self._group.abort()
            raise UnavailableError(
                f"expert-parallel rank {self._rank}: expected rows {list(recv_splits)}, "
                f"peers sent {got}"
            )
        return torch.cat(received)  # [sum(recv_splits), ...] (a new tensor)

    def all_reduce_max(self, values: Sequence[int]) -> list[int]:
        """Element-wise max over the thread ranks."""
        posted = self._group.exchange(self._rank, list(values))
        return [max(column) for column in zip(*posted, strict=True)]

    def all_reduce_sum(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over the thread ranks, in place (rank order, as every rank sums)."""
        posted = self._group.exchange(self._rank, tensor.clone())
        total = posted[0].clone()
        for part in posted[1:]:
            total += part
        tensor.copy_(total)

    def all_gather_last(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every thread rank's ``tensor`` concatenated along the last dim, in rank order."""
        posted = self._group.exchange(self._rank, tensor.clone())
        return torch.cat(posted, dim=-1)

    def close(self) -> None:
        """Leave: every peer's pending and future collective raises."""
        self._group.abort()
