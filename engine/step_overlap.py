"""Overlapped steps (``engine.async_scheduling``): a step queued on the device, not yet read.

The engine queues step N+1 — plan, forward, sampling, the read-back of its sampled ids — before
it reads step N's ids, so the device never idles while the host schedules. An
:class:`InFlightStep` is what the engine keeps of a queued step until it settles it; the next
step's decode inputs that step N sampled come from :meth:`InFlightStep.pending_tokens`, on the
device. The scheduler meanwhile counts those tokens as placeholders
(:attr:`engine.request.Request.num_output_placeholders`).

Some batches need the previous token on the host before they can be sampled: a structured-output
row's grammar mask depends on it, penalties count it, and prompt logprobs are read back in full.
For those (:func:`needs_host_before`) the engine settles the step in flight first, so that one
step runs synchronously; everything else stays overlapped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.device_io import PendingRead
from engine.model_runner import PendingTokens
from engine.sampling.rejection import VerifiedTokens
from engine.sampling.sampler import DeviceSample, SamplerOutput
from engine.scheduler.output import SchedulerOutput


@dataclass(frozen=True)
class InFlightStep:
    """A step queued on the device: its plan, which requests it samples (in row order), its
    prompt logits, its device-side samples and their read-back (None: it samples nothing),
    and its verify rows' outcomes (speculative decoding; those steps are never overlapped,
    so their outcomes are on the host already)."""

    plan: SchedulerOutput
    request_ids: list[str]
    prompt_logits: dict[str, tuple[int, torch.Tensor]]
    sample: DeviceSample | None
    read: PendingRead | None
    launched_s: float
    verified: dict[str, VerifiedTokens] = field(default_factory=dict)
    _rows: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_rows", {rid: i for i, rid in enumerate(self.request_ids)})

    def pending_tokens(self) -> PendingTokens | None:
        """This step's sampled ids where they are, for the next step's inputs."""
        if self.sample is None:
            return None
        return PendingTokens(self._rows, self.sample.token_ids)

    def read_samples(self) -> SamplerOutput:
        """Wait for the read-back (once) and return the samples on the host."""
        if self.sample is None or self.read is None:
            return SamplerOutput(token_ids=[], logprobs=[], finite=[])
        return self.sample.to_output(self.read.wait())


def needs_host_before(plan: SchedulerOutput) -> bool:
    """True when a row of ``plan`` needs the step before it read on the host first."""
    for item in plan.scheduled:
        params = item.sampling_params
        if item.samples_token and (params.structured_output is not None or params.penalized):
            return True
        if params.prompt_logprobs is not None:
            return True
    return False
