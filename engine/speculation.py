"""The engine's speculative decoding around each step: verify the drafts a step scored, then ask
for the next ones.

With ``engine.speculative`` every running request that may speculate gets its proposer's
guesses after each step (:mod:`engine.spec_decode`), sized by its measured acceptance
(:class:`~engine.spec_decode.DraftLengths`); the next plan scores them as one multi-token row,
and the rejection sampler (:mod:`engine.sampling.rejection`) keeps a prefix of them plus one
token of the model's own. Requests with structured output or prompt logprobs never speculate
(the grammar must see each token before the next is scored; prompt logprobs are read back with
the whole prompt), nor does any request while more than ``disable_by_batch_size`` run.

Never slower (``pause_unprofitable_drafts``): the engine reports how long each step took
(:meth:`Speculation.step_done`); decode-only steps feed a fit of what rows and drafts cost
(:class:`~engine.spec_decode.StepCosts`), and a request drafts only while its measured
acceptance beats its verify row's measured cost at the current batch size
(:class:`~engine.spec_decode.DraftPayoff`). A seeded request is exempt: its output must not
depend on timings.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import torch

from core.config import SpeculativeConfig
from core.errors import ConfigError
from core.sampling import SamplingParams
from engine.draft_proposer import DraftModelProposer, DraftTarget
from engine.outputs import RequestOutput
from engine.sampling import DraftedRequest, RejectionSampler, Sampler, SamplingRow
from engine.sampling.rejection import VerifiedTokens
from engine.scheduler import Scheduler
from engine.scheduler.output import ScheduledRequest, SchedulerOutput
from engine.spec_decode import (
    BatchProposer,
    DraftLengths,
    DraftPayoff,
    DraftQuery,
    EachRequest,
    StepCosts,
    build_proposer,
)


class Speculation:
    """One engine's proposer, draft lengths and rejection sampler (the engine thread only)."""

    def __init__(
        self, config: SpeculativeConfig, sampler: Sampler, target: DraftTarget | None = None
    ) -> None:
        """``target``: the engine's model and KV, which a draft model must match and sizes its
        own KV from (``method: draft_model`` only)."""
        self.config = config
        self.proposer = _build_proposer(config, target)
        self.draft_lengths = DraftLengths(
            config.num_speculative_tokens, adaptive=config.adaptive_draft_length
        )
        self.rejection = RejectionSampler(sampler)
        self.payoff = DraftPayoff(StepCosts()) if config.pause_unprofitable_drafts else None
        self._propose_s = 0.0
        """Seconds the latest :meth:`propose` took (the next step's cost, not this one's)."""
        self._carried_propose_s = 0.0

    def verify(
        self,
        plan: SchedulerOutput,
        verify_logits: dict[str, torch.Tensor],
        sampling_row: Callable[[ScheduledRequest], SamplingRow],
        fail: Callable[[str, str], None],
    ) -> dict[str, VerifiedTokens]:
        """Accept a prefix of each verify row's drafts plus one token (host-side: a speculating
        engine never overlaps steps). Should the batch raise, each request is verified alone
        and those that still raise are ``fail`` ed alone (a seeded request verified in the
        failed batch has drawn its uniforms twice)."""
        by_id = {item.request_id: item for item in plan.scheduled}
        try:
            drafted = {rid: _drafted(by_id[rid], sampling_row) for rid in verify_logits}
            values = torch.cat([verify_logits[rid] for rid in drafted])
            outcomes = self.rejection.verify(values, list(drafted.values()))
            verified = dict(zip(drafted, outcomes, strict=True))
        except Exception:
            verified = {}
            for request_id, logits in verify_logits.items():
                try:
                    one = _drafted(by_id[request_id], sampling_row)
                    verified[request_id] = self.rejection.verify(logits, [one])[0]
                except Exception as e:
                    fail(request_id, f"verifying its drafts failed: {e!r}")
        for request_id, outcome in verified.items():
            num_drafted = len(by_id[request_id].draft_token_ids)
            self.draft_lengths.record(request_id, num_drafted, outcome.num_accepted)
            if self.payoff is not None:
                self.payoff.record(request_id, num_drafted, outcome.num_accepted)
        return verified

    def step_done(self, plan: SchedulerOutput, seconds: float) -> None:
        """``plan``'s step took ``seconds`` of wall clock, from its launch to the end of the
        proposals made after it. A decode-only step feeds the cost fit, charged with the
        proposals that made its drafts (made in the step before) instead of its own."""
        own_propose_s, self._propose_s = self._propose_s, 0.0
        cost_s = seconds - own_propose_s + self._carried_propose_s
        self._carried_propose_s = own_propose_s
        if self.payoff is None or not _decode_only(plan):
            return
        drafted = [len(item.draft_token_ids) for item in plan.scheduled]
        num_verify_rows = sum(1 for n in drafted if n)
        self.payoff.costs.record(len(drafted), num_verify_rows, sum(drafted), cost_s)

    def propose(
        self,
        outputs: Sequence[RequestOutput],
        params_of: Callable[[str], SamplingParams | None],
        scheduler: Scheduler,
    ) -> None:
        """Draft for every request of ``outputs`` that goes on and may speculate
        (``params_of``: a live request's sampling parameters, None once it is forgotten)."""
        started = time.perf_counter()
        try:
            self._propose(outputs, params_of, scheduler)
        finally:
            self._propose_s = time.perf_counter() - started

    def _propose(
        self,
        outputs: Sequence[RequestOutput],
        params_of: Callable[[str], SamplingParams | None],
        scheduler: Scheduler,
    ) -> None:
        num_rows = scheduler.num_running
        limit = self.config.disable_by_batch_size
        if limit is not None and num_rows > limit:
            return
        queries: list[DraftQuery] = []
        for output in outputs:
            params = params_of(output.request_id)
            if output.finished or params is None or not may_speculate(params):
                continue
            request = scheduler.get_request(output.request_id)
            if request is None or request.prefill_only:
                continue
            num_tokens = self.draft_lengths.next(output.request_id)
            # NOTE: a seeded request's draws depend on which of its steps verify drafts; a
            # rule read from timings would make its output differ run to run
            payoff = self.payoff if params.seed is None else None
            if payoff is not None and not payoff.should_draft(
                output.request_id, num_rows, num_tokens
            ):
                continue
            queries.append(
                DraftQuery(
                    output.request_id,
                    request.all_token_ids,
                    request.num_prompt_tokens,
                    num_tokens,
                )
            )
        if not queries:
            return
        for query, drafts in zip(queries, self.proposer.propose_batch(queries), strict=True):
            if drafts:
                scheduler.set_draft_tokens(query.request_id, drafts)

    def forget(self, request_id: str) -> None:
        """The request ended: drop its proposer state and draft length (idempotent)."""
        self.proposer.finish(request_id)
        self.draft_lengths.forget(request_id)
        if self.payoff is not None:
            self.payoff.forget(request_id)


def _build_proposer(config: SpeculativeConfig, target: DraftTarget | None) -> BatchProposer:
    """The draft model's proposer (it needs the engine's model), else the draft-free one."""
    if config.method != "draft_model":
        return EachRequest(build_proposer(config))
    if target is None:
        raise ConfigError(
            "method 'draft_model' needs the engine's model to match", param="speculative.method"
        )
    return DraftModelProposer(config, target)


def may_speculate(params: SamplingParams) -> bool:
    """False for structured output and prompt logprobs (see the module docstring)."""
    return params.structured_output is None and params.prompt_logprobs is None


def _decode_only(plan: SchedulerOutput) -> bool:
    """True when every request of ``plan`` decodes one token (plus its drafts, if any)."""
    return bool(plan.scheduled) and all(
        item.samples_token and item.num_new_tokens == 1 + len(item.draft_token_ids)
        for item in plan.scheduled
    )


def _drafted(
    item: ScheduledRequest, sampling_row: Callable[[ScheduledRequest], SamplingRow]
) -> DraftedRequest:
    """``item``'s k + 1 sampling rows: row j as if drafts 0..j-1 had been sampled."""
    row = sampling_row(item)
    drafts = item.draft_token_ids
    rows = [
        dataclasses.replace(
            row,
            num_generated_tokens=row.num_generated_tokens + j,
            output_token_ids=[*row.output_token_ids, *drafts[:j]]
            if row.params.penalized
            else row.output_token_ids,
        )
        for j in range(len(drafts) + 1)
    ]
    return DraftedRequest(drafts, tuple(rows))
