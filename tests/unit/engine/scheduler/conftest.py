"""A fake model over a simulated paged KV store, to drive the scheduler end to end.

The fake runner writes each scheduled token id into the slot its block table names, and samples
``next_token`` of the context it *reads back from those slots*. A wrong block table, a wrong
start position, a shared block overwritten, a freed block still read, or a prefix hit on the
wrong content all change the sampled tokens, so comparing against ``reference_tokens`` (the same
function applied to the true history, no scheduler) checks the KV bookkeeping, not just the
scheduler's own claims.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from core.config import EngineConfig
from core.kv_events import KVEventBatch
from core.sampling import SamplingParams
from engine.request import FinishReason, Request
from engine.scheduler import Scheduler, SchedulerOutput
from engine.scheduler.output import PENDING_TOKEN_ID

VOCAB = 50
EOS = 0  # next_token never returns 0, so EOS only appears when a test forces it


def next_token(context: Sequence[int]) -> int:
    """The fake model: a deterministic function of the whole token history, in 1..VOCAB-1."""
    acc = len(context)
    for position, token_id in enumerate(context):
        acc = (acc * 31 + token_id * (position + 7)) % 1_000_003
    return 1 + acc % (VOCAB - 1)


def reference_tokens(prompt: Sequence[int], num_tokens: int) -> list[int]:
    """What an unscheduled run of the fake model generates."""
    history = list(prompt)
    for _ in range(num_tokens):
        history.append(next_token(history))
    return history[len(prompt) :]


class FakeKVRunner:
    """Executes plans against token-id "KV" slots ``block_id * block_size + offset``."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.slots: list[int | None] = [None] * (num_blocks * block_size)
        self.override: dict[str, int] = {}  # request id -> token to sample instead (once)

    def slot(self, block_ids: list[int], position: int) -> int:
        return block_ids[position // self.block_size] * self.block_size + position % self.block_size

    def execute(
        self, output: SchedulerOutput, pending: dict[str, int] | None = None
    ) -> dict[str, int]:
        """Run a plan; ``PENDING_TOKEN_ID`` inputs take ``pending[request_id]`` (the ids the
        step before sampled, which an overlapped scheduler has not been told yet)."""
        sampled: dict[str, int] = {}
        for item in output.scheduled:
            assert 0 not in item.block_ids, "the null block is in a block table"
            assert len(item.block_ids) * self.block_size >= item.end_position
            for offset, token_id in enumerate(item.token_ids):
                if token_id == PENDING_TOKEN_ID:
                    assert pending is not None and item.request_id in pending
                    token_id = pending[item.request_id]
                self.slots[self.slot(item.block_ids, item.start_position + offset)] = token_id
            if item.samples_token:
                context = [
                    self.slots[self.slot(item.block_ids, p)] for p in range(item.end_position)
                ]
                assert None not in context, f"{item.request_id} read an unwritten slot"
                forced = self.override.pop(item.request_id, None)
                model_token = next_token(context)  # type: ignore[arg-type]
                sampled[item.request_id] = model_token if forced is None else forced
        return sampled


@dataclass
class Harness:
    """A scheduler, its fake runner, and everything they reported."""

    scheduler: Scheduler
    runner: FakeKVRunner
    batches: list[KVEventBatch]
    outputs: dict[str, list[int]] = field(default_factory=dict)
    reasons: dict[str, FinishReason | None] = field(default_factory=dict)
    cached_tokens: dict[str, int] = field(default_factory=dict)
    plans: list[SchedulerOutput] = field(default_factory=list)
    in_flight: tuple[SchedulerOutput, dict[str, int]] | None = None
    """Overlapped steps: the plan executed but not applied yet, and what it sampled."""

    def add(
        self, request_id: str, prompt: Sequence[int], max_tokens: int = 8, **kw: Any
    ) -> Request:
        sampling = SamplingParams(
            max_tokens=max_tokens,
            **{k: kw.pop(k) for k in ("stop_token_ids", "min_tokens", "ignore_eos") if k in kw},
        )
        request = Request(request_id, list(prompt), sampling, eos_token_ids=(EOS,), **kw)
        self.scheduler.add_request(request)
        self.outputs[request_id] = []
        return request

    def step(self) -> SchedulerOutput:
        """Plan, execute and apply one step. Overlapped (``scheduler.async_scheduling``): the
        step is executed with the previous step's samples and the *previous* step is applied,
        as the engine does."""
        output = self.scheduler.schedule()
        self.scheduler.check_integrity()
        self.plans.append(output)
        assert output.num_scheduled_tokens <= self.scheduler.max_num_batched_tokens
        assert all(item.num_new_tokens >= 1 for item in output.scheduled)
        if not self.scheduler.async_scheduling:
            self._apply(output, self.runner.execute(output))
            return output
        previous = self.in_flight
        sampled = self.runner.execute(output, previous[1] if previous else None)
        self.in_flight = (output, sampled) if output.scheduled else None
        if previous is not None:
            self._apply(*previous)
        if not output.scheduled and self.in_flight is None:
            self.scheduler.check_integrity()
        return output

    def _apply(self, output: SchedulerOutput, sampled: dict[str, int]) -> None:
        for update in self.scheduler.update_from_output(output, sampled):
            self.outputs.setdefault(update.request_id, []).extend(update.new_token_ids)
            self.cached_tokens[update.request_id] = update.num_cached_tokens
            if update.finished:
                self.reasons[update.request_id] = update.finish_reason
        self.scheduler.check_integrity()

    def run(self, max_steps: int = 2000) -> None:
        for _ in range(max_steps):
            if not self.scheduler.has_unfinished() and self.in_flight is None:
                return
            self.step()
        raise AssertionError(f"still unfinished after {max_steps} steps")

    def assert_pool_whole(self) -> None:
        kv = self.scheduler.kv
        self.scheduler.check_integrity()
        assert kv.block_tables() == {}
        assert kv.num_free_blocks == kv.pool.num_usable_blocks
        assert kv.usage == 0.0


MakeHarness = Callable[..., Harness]


@pytest.fixture
def make_harness() -> MakeHarness:
    def build(
        num_blocks: int = 64,
        *,
        block_size: int = 4,
        budget: int = 16,
        max_num_seqs: int = 8,
        max_model_len: int = 200,
        caching: bool = True,
        long_prefill: int | None = None,
        overlap: bool = False,
    ) -> Harness:
        batches: list[KVEventBatch] = []
        config = EngineConfig(
            block_size=block_size,
            max_num_batched_tokens=budget,
            max_num_seqs=max_num_seqs,
            enable_prefix_caching=caching,
            hash_seed=3,
            long_prefill_token_threshold=long_prefill,
        )
        scheduler = Scheduler(
            config,
            num_blocks,
            max_model_len=max_model_len,
            kv_event_callback=batches.append,
            async_scheduling=overlap,
        )
        return Harness(scheduler, FakeKVRunner(num_blocks, block_size), batches)

    return build


@pytest.fixture
def reference() -> Callable[[Sequence[int], int], list[int]]:
    return reference_tokens
