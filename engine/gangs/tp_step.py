"""Driving a tensor-parallel gang: rank 0 plans each step, the other ranks run its forward.

Rank 0 (the leader) is an ordinary :class:`~engine.engine.LLMEngine`: its scheduler and KV
manager decide every step, its sampler draws every token. Its model runner is a
:class:`LeaderRunner`, which, before each forward, broadcasts the step to the followers: the
requests whose per-request state ended since the last step, and each scheduled request's tokens,
start position, block table, whether it samples and whether it wants prompt logprobs. A follower
(:func:`follow_leader`) runs the same :class:`~engine.model_runner.ModelRunner` forward on the
same blocks with its own shard of the weights and of the KV heads, so every rank's all-reduces
and logit gathers pair up, and its KV cache holds its heads of exactly the blocks rank 0 filled.
Followers never sample; their logits are dropped.

With overlapped steps a request's last input may be the id rank 0 sampled in the previous
step, still on rank 0's device: rank 0 gathers those ids in batch order and shares them over the
model's collective (:func:`share_from_rank0`), so no rank's host ever waits for them.

A step travels as one int64 tensor (:func:`encode_step` / :func:`decode_step`; no pickle)
broadcast from rank 0 on the gang's control group — a gloo group apart from the one the model's
collectives use, so a follower may wait for the next step as long as the leader stays idle
without timing out the model's collectives. A :data:`STOP` message ends the followers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from core.errors import UnavailableError
from core.sampling import SamplingParams
from engine.device_io import upload
from engine.kv.storage import KVStorage
from engine.model_runner import ModelRunner, PendingTokens, StepLogits
from engine.models import CausalLM
from engine.scheduler.output import PENDING_TOKEN_ID, ScheduledRequest

logger = logging.getLogger(__name__)

_STEP, _STOP = 1, 0
_NO_PROMPT_LOGPROBS = -1


@dataclass(frozen=True)
class TPStep:
    """One step as the followers run it."""

    released: tuple[str, ...]  # requests whose runner state ended before this step
    scheduled: tuple[ScheduledRequest, ...]
    stage_in: tuple[int, ...] = ()  # blocks to copy host mirror -> device before the step
    stage_out: tuple[int, ...] = ()  # blocks to copy device -> host mirror, then a barrier


STOP = TPStep((), ())
"""The message that ends the followers (encoded apart from an empty step)."""


class StoppableGang(Protocol):
    """What the leader holds of its gang: the followers it started, stopped when it closes
    (:class:`~engine.gangs.tp_gang.Gang`)."""

    def close(self) -> None:
        """Stop the followers and leave the gang."""
        ...


def encode_step(step: TPStep | None) -> torch.Tensor:
    """``step`` (None: :data:`STOP`) as a flat int64 tensor."""
    if step is None:
        return torch.tensor([_STOP], dtype=torch.int64)
    words: list[int] = [_STEP, len(step.released), len(step.scheduled)]
    for request_id in step.released:
        _put_text(words, request_id)
    for item in step.scheduled:
        _put_text(words, item.request_id)
        words.append(len(item.token_ids))
        words.extend(item.token_ids)
        words.append(item.start_position)
        words.append(len(item.block_ids))
        words.extend(item.block_ids)
        words.append(int(item.samples_token))
        prompt_logprobs = item.sampling_params.prompt_logprobs
        words.append(_NO_PROMPT_LOGPROBS if prompt_logprobs is None else prompt_logprobs)
    for block_ids in (step.stage_in, step.stage_out):
        words.append(len(block_ids))
        words.extend(block_ids)
    return torch.tensor(words, dtype=torch.int64)


def decode_step(tensor: torch.Tensor) -> TPStep | None:
    """The step :func:`encode_step` wrote (None for :data:`STOP`); ``ValueError`` when the
    words do not parse exactly."""
    words = tensor.tolist()
    reader = _Words(words)
    if reader.take() == _STOP:
        return None
    num_released, num_scheduled = reader.take(), reader.take()
    released = tuple(reader.text() for _ in range(num_released))
    scheduled = []
    for _ in range(num_scheduled):
        request_id = reader.text()
        token_ids = reader.many(reader.take())
        start_position = reader.take()
        block_ids = reader.many(reader.take())
        samples_token = bool(reader.take())
        prompt_logprobs = reader.take()
        params = SamplingParams(
            prompt_logprobs=None if prompt_logprobs == _NO_PROMPT_LOGPROBS else prompt_logprobs
        )
        scheduled.append(
            ScheduledRequest(
                request_id, token_ids, start_position, block_ids, samples_token, params, 0
            )
        )
    stage_in = tuple(reader.many(reader.take()))
    stage_out = tuple(reader.many(reader.take()))
    if not reader.done():
        raise ValueError(f"tensor-parallel step: {len(words) - reader.at} words left over")
    return TPStep(released, tuple(scheduled), stage_in, stage_out)


def _put_text(words: list[int], text: str) -> None:
    data = text.encode()
    words.append(len(data))
    words.extend(data)


class _Words:
    def __init__(self, words: list[int]) -> None:
        self.words = words
        self.at = 0

    def take(self) -> int:
        if self.at >= len(self.words):
            raise ValueError("tensor-parallel step: message ends early")
        self.at += 1
        return self.words[self.at - 1]

    def many(self, count: int) -> list[int]:
        if count < 0 or self.at + count > len(self.words):
            raise ValueError("tensor-parallel step: message ends early")
        self.at += count
        return self.words[self.at - count : self.at]

    def text(self) -> str:
        return bytes(self.many(self.take())).decode()

    def done(self) -> bool:
        return self.at == len(self.words)


class StepChannel(Protocol):
    """How rank 0 hands each step to the other ranks (every rank calls, in the same order)."""

    def send(self, step: TPStep | None) -> None:
        """Rank 0: broadcast ``step`` (None: stop)."""
        ...

    def receive(self) -> TPStep | None:
        """Another rank: the next step rank 0 sent (None: stop)."""
        ...

    def barrier(self) -> None:
        """Every rank: return once all ranks reached it."""
        ...


class BroadcastChannel:
    """A :class:`StepChannel` over a ``torch.distributed`` (gloo) group: a length, then the
    words. Raises :class:`UnavailableError` when a peer is gone."""

    def __init__(self, group: torch.distributed.ProcessGroup, rank: int) -> None:
        self.group = group
        self.rank = rank

    def send(self, step: TPStep | None) -> None:
        words = encode_step(step)
        self._broadcast(torch.tensor([words.numel()], dtype=torch.int64))
        self._broadcast(words)

    def receive(self) -> TPStep | None:
        length = torch.zeros(1, dtype=torch.int64)
        self._broadcast(length)
        words = torch.zeros(int(length.item()), dtype=torch.int64)
        self._broadcast(words)
        return decode_step(words)

    def barrier(self) -> None:
        try:
            torch.distributed.barrier(group=self.group)
        except RuntimeError as e:
            raise UnavailableError(
                f"tensor-parallel rank {self.rank}: barrier failed, a peer rank died: {e}"
            ) from e

    def _broadcast(self, tensor: torch.Tensor) -> None:
        try:
            torch.distributed.broadcast(tensor, src=0, group=self.group)
        except RuntimeError as e:  # DistBackendError is a RuntimeError
            raise UnavailableError(
                f"tensor-parallel rank {self.rank}: step broadcast failed, a peer rank died or "
                f"stalled: {e}"
            ) from e


class LeaderRunner(ModelRunner):
    """Rank 0's model runner: every forward is first broadcast to the followers. It also
    stages the followers' KV as rank 0's storage stages its own (its ``peers``), so their host
    mirrors hold what the transfer layer reads and writes; :attr:`rank_storages` are every
    rank's storage as this process reaches it (the followers' through their shared memory)."""

    def __init__(
        self,
        model: CausalLM,
        storage: KVStorage,
        channel: StepChannel,
        *,
        graph_batch_sizes: Sequence[int] = (),
        max_model_len: int | None = None,
        gang: StoppableGang | None = None,
    ) -> None:
        """``gang``: the local gang whose followers this leader started, stopped by
        :meth:`close`."""
        super().__init__(
            model, storage, graph_batch_sizes=graph_batch_sizes, max_model_len=max_model_len
        )
        self.channel = channel
        self.gang = gang
        self._released: list[str] = []
        self._broken = False
        self.follower_storages: tuple[KVStorage, ...] = ()
        """Ranks 1.. storages mapped here (empty: a follower's KV is not in shared memory)."""
        storage.peers = self

    @property
    def rank_storages(self) -> tuple[KVStorage, ...]:
        """Every rank's storage, rank 0's first; only rank 0's until the followers' are
        mapped."""
        return (self.storage, *self.follower_storages)

    def stage_to_host(self, block_ids: list[int]) -> None:
        """The followers copy ``block_ids`` to their host mirrors; returns once they did."""
        self._send(TPStep((), (), stage_out=tuple(block_ids)))
        try:
            self.channel.barrier()
        except UnavailableError:
            self._broken = True
            raise

    def stage_to_device(self, block_ids: list[int]) -> None:
        """The followers copy ``block_ids`` to their devices before their next step."""
        self._send(TPStep((), (), stage_in=tuple(block_ids)))

    def _send(self, step: TPStep) -> None:
        try:
            self.channel.send(step)
        except UnavailableError:  # a rank died or stalled: the gang never steps again
            self._broken = True
            raise

    def release(self, request_ids: Sequence[str]) -> None:
        """Forget the requests here; the followers forget them with the next step."""
        super().release(request_ids)
        self._released.extend(request_ids)

    def execute(
        self, scheduled: list[ScheduledRequest], pending: PendingTokens | None = None
    ) -> StepLogits:
        """Broadcast the step, share the ids it takes from the previous step's samples (an
        overlapped step), then run rank 0's share of it."""
        released, self._released = tuple(self._released), []
        self._send(TPStep(released, tuple(scheduled)))
        try:
            return super().execute(scheduled, self._share_pending(scheduled, pending))
        except UnavailableError:  # a collective found a rank gone
            self._broken = True
            raise

    def _share_pending(
        self, scheduled: Sequence[ScheduledRequest], pending: PendingTokens | None
    ) -> PendingTokens | None:
        """The pending ids this step reads, gathered in batch order and sent to the followers
        over the model's collective (on the device: the host never waits for them)."""
        waiting = pending_requests(scheduled)
        if not waiting or pending is None:
            return pending
        rows = upload([pending.rows[request_id] for request_id in waiting], torch.long, self.device)
        token_ids = pending.token_ids.index_select(0, rows)
        share_from_rank0(self.model, token_ids)
        return PendingTokens({request_id: i for i, request_id in enumerate(waiting)}, token_ids)

    @property
    def usable(self) -> bool:
        """False once a step found the gang broken (a rank gone)."""
        return not self._broken

    def close(self) -> None:
        """Stop the gang's followers; idempotent."""
        if self.gang is not None:
            self.gang.close()


def share_from_rank0(model: CausalLM, tensor: torch.Tensor) -> None:
    """``tensor`` becomes rank 0's on every rank (the other ranks pass zeros: a sum)."""
    if model.tp is None:
        raise ValueError("not a rank of a tensor-parallel gang")
    model.tp.all_reduce(tensor)


def pending_requests(scheduled: Sequence[ScheduledRequest]) -> list[str]:
    """The requests whose last input is the previous step's sampled id, in batch order."""
    return [item.request_id for item in scheduled if item.token_ids[-1] == PENDING_TOKEN_ID]


def follow_leader(runner: ModelRunner, channel: StepChannel) -> int:
    """A follower's loop: run every step rank 0 sends until it sends stop; returns the number
    of steps run. Raises what a step or the channel raises (the gang is broken then)."""
    steps = 0
    device = runner.device
    while (step := channel.receive()) is not None:
        runner.release(step.released)
        if step.stage_in:  # the runner orders its next step after the copy
            runner.storage.stage_to_device(list(step.stage_in))
        if step.stage_out:
            runner.storage.stage_to_host(list(step.stage_out))
            for block_id in step.stage_out:
                runner.storage.staging.wait_host(block_id)
            channel.barrier()
        if step.scheduled:
            waiting = pending_requests(step.scheduled)
            pending = None
            if waiting:  # an overlapped step: rank 0 shares the sampled ids it takes
                token_ids = torch.zeros(len(waiting), dtype=torch.long, device=device)
                share_from_rank0(runner.model, token_ids)
                pending = PendingTokens({r: i for i, r in enumerate(waiting)}, token_ids)
            runner.execute(list(step.scheduled), pending)
        steps += 1
    logger.info("tensor-parallel follower: stopped after %d steps", steps)
    return steps
