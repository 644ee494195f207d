"""The engine step loop both roles run: schedule -> forward -> sample -> update -> outputs.

Plain Python, no Ray: ``add_request`` / ``step()`` / ``abort`` / ``has_unfinished``. The prefill
and decode roles drive it through the same calls plus the scheduler's disaggregation hooks
(prefill-only requests that pin their KV, import requests whose KV arrives from outside).
With ``engine.speculative`` each step also verifies the drafts it scored and asks for the next
ones (:mod:`engine.speculation`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence

import torch

from core.errors import ConfigError, InvalidRequestError
from core.hashing import BlockHash
from core.sampling import SamplingParams
from core.shared_memory import SHM_DIR
from engine.admission import check_request, request_generator
from engine.device_io import DeviceReader, upload
from engine.kv.storage import KVStorage
from engine.lora import LoRARequest
from engine.model_runner import ModelRunner, StepLogits
from engine.output_processor import OutputProcessor, RequestState
from engine.outputs import RequestOutput, TokenLogprob
from engine.prefill_rate import PrefillRate
from engine.request import FinishReason, Request, RequestStatus
from engine.sampling import Sampler, SamplingRow
from engine.sampling.grammar import GrammarStates
from engine.sampling.sampler import DeviceSample, SamplerOutput
from engine.scheduler import Scheduler
from engine.scheduler.output import (
    ImportAllocation,
    PinnedBlocks,
    ScheduledRequest,
    SchedulerOutput,
)
from engine.setup import EngineParts, draft_target
from engine.speculation import Speculation
from engine.step_overlap import InFlightStep, needs_host_before

logger = logging.getLogger(__name__)

_LOAD_WAIT_S = 0.005
"""Longest an empty step waits for a KV-tier load to finish (nothing else is runnable then)."""


class LLMEngine:
    """One model, one KV cache, one continuous batch."""

    def __init__(self, parts: EngineParts, *, runner: ModelRunner | None = None) -> None:
        """``runner``: the model runner over ``parts``' model and KV storage, when it is not
        the plain one (rank 0 of a tensor-parallel gang passes its broadcasting runner)."""
        self.parts = parts
        self.tokenizer = parts.tokenizer
        self.scheduler: Scheduler = parts.scheduler
        self.runner = runner or ModelRunner(
            parts.model,
            parts.storage,
            compiled=parts.compiled,
            graph_batch_sizes=parts.cuda_graph_batch_sizes,
            max_model_len=parts.scheduler.max_model_len,
            lora=parts.lora,
        )
        self.sampler = Sampler(seed=parts.seed)
        self.speculation = (
            None
            if parts.speculative is None
            else Speculation(parts.speculative, self.sampler, draft_target(parts))
        )
        self.async_scheduling = parts.scheduler.async_scheduling
        """Overlapped steps: a step's samples are read after the next step is queued."""
        self.reader = DeviceReader(parts.storage.device)
        self._in_flight: InFlightStep | None = None
        self.outputs = OutputProcessor(parts.tokenizer)
        self.prefill_rate = PrefillRate()
        self._states: dict[str, RequestState] = {}
        self._generators: dict[str, torch.Generator] = {}
        self.grammars = GrammarStates(parts.tokenizer, parts.arch.vocab_size, parts.eos_token_ids)
        self._failed: list[RequestOutput] = []
        """Final outputs of requests that failed alone during a step, returned with its outputs."""

    @property
    def max_model_len(self) -> int:
        """Longest prompt + output, in tokens."""
        return self.scheduler.max_model_len

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        prompt: str | None = None,
        prefill_only: bool = False,
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Queue a request; raises ``InvalidRequestError`` (``PromptTooLongError``, ...) naming
        the field. Everything that can refuse it runs before it is queued; should anything
        raise once the scheduler holds it, it is aborted (blocks freed) before the error
        propagates — a request is either fully admitted or not in the engine at all.
        ``cache_salt`` keeps its cached blocks apart from those of other salts.
        ``lora_request``: run under that adapter (loaded now if it is not; a bad adapter
        raises its :class:`~core.errors.LoRAAdapterError`)."""
        self.check_request(request_id, prompt_token_ids, params)
        if lora_request is not None:
            self.add_lora(lora_request)
        request = Request(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling_params=params,
            eos_token_ids=self.parts.eos_token_ids,
            prefill_only=prefill_only,
            cache_salt=cache_salt,
            lora_name=lora_request.lora_name if lora_request is not None else None,
        )
        state = self.outputs.new_state(request_id, prompt_token_ids, params, prompt)
        generator = request_generator(params)
        with self._admitting(request):
            self.scheduler.add_request(request)
            if self.parts.lora is not None and lora_request is not None:
                self.parts.lora.bind(request_id, lora_request)
            self._track(request_id, state, generator)
            self.grammars.start(request_id, params.structured_output)

    def check_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        *,
        first_token_id: int | None = None,
    ) -> None:
        """Raise ``InvalidRequestError`` (naming the field) unless the request could be admitted
        now (see :func:`engine.admission.check_request`); queues nothing."""
        check_request(
            request_id,
            prompt_token_ids,
            params,
            vocab_size=self.parts.arch.vocab_size,
            first_token_id=first_token_id,
        )
        self.grammars.check(params.structured_output)

    def add_lora(self, lora_request: LoRARequest) -> None:
        """Load (and check) an adapter into host memory now, vLLM's ``add_lora``; raises its
        :class:`~core.errors.LoRAAdapterError`, or ``InvalidRequestError`` without
        ``enable_lora``. Its residency: ``parts.lora``."""
        if self.parts.lora is None:
            raise InvalidRequestError(
                "this engine serves no LoRA adapters (enable_lora is off)", param="lora_request"
            )
        self.parts.lora.add_adapter(lora_request)

    def remove_lora(self, lora_name: str) -> bool:
        """Unload an adapter from host and device (vLLM's ``remove_lora``, by name); False when
        it was not loaded. Refused (``InvalidRequestError``) while requests run under it."""
        return self.parts.lora is not None and self.parts.lora.remove_adapter(lora_name)

    # -- disaggregation hooks (prefill role: pin and release; decode role: import) -----------

    def get_pinned_blocks(self, request_id: str) -> PinnedBlocks | None:
        """The KV blocks a finished prefill-only request holds until :meth:`release`."""
        return self.scheduler.get_pinned_blocks(request_id)

    def release(self, request_id: str) -> bool:
        """Unpin a prefill-only request's blocks; False when nothing was pinned."""
        return self.scheduler.release(request_id)

    def pin_prefix(self, pin_id: str, block_hashes: Sequence[BlockHash]) -> list[int]:
        """Pin the leading run of ``block_hashes`` this engine's prefix cache holds (a hot
        prefix another replica copies) and stage it where the transfer layer reads it; their
        block ids, leading first (empty: the first is not cached). :meth:`unpin_prefix` ends it."""
        block_ids = self.scheduler.kv.pin_cached(pin_id, block_hashes)
        self.parts.storage.stage_to_host(block_ids)
        return block_ids

    def pin_request(self, request_id: str, pin_id: str) -> tuple[list[BlockHash], list[int]] | None:
        """Pin, under ``pin_id``, the leading run of a decoding request's computed full blocks
        (prompt and tokens so far) the prefix cache holds, staged for an export: its replica is
        leaving and another one will continue it from them (the caller aborts it next). Returns
        ``(block hashes, block ids)`` (both empty when no block is cached), or None for a
        request that is unknown, finished or not decoding yet (still queued, importing or
        loading: it has nothing worth pulling)."""
        request = self.scheduler.get_request(request_id)
        if request is None or request.status is not RequestStatus.RUNNING:
            return None
        kv = self.scheduler.kv
        hashes = list(kv.block_hashes(request, request.num_computed_tokens // kv.block_size))
        block_ids = self.pin_prefix(pin_id, hashes) if hashes else []
        return hashes[: len(block_ids)], block_ids

    def unpin_prefix(self, pin_id: str) -> bool:
        """Release a :meth:`pin_prefix` pin; False when it holds nothing (already released)."""
        return self.scheduler.kv.unpin(pin_id)

    def admit_prefix(
        self, block_hashes: Sequence[BlockHash], payloads: Sequence[torch.Tensor]
    ) -> int:
        """A prefix's blocks pulled from another replica (``uint8`` rows of the layout's
        ``block_bytes``, leading first) into this engine's host tier, where requests find them
        as host hits — without a host tier, into free device blocks of the prefix cache
        (``KVCacheManager.admit_blocks``; not under tensor parallelism); how many of a leading
        run it took. Their ``BlockStored`` events are published at once: the routers learn of
        the copy without waiting for a step, which an idle replica may not take for long."""
        tiers = self.scheduler.tiers
        if tiers is not None:
            num_admitted = tiers.admit(list(block_hashes), list(payloads))
        elif self.parts.layout.tp_size == 1:
            rows = self.parts.storage.block_bytes_view()
            num_bytes = int(rows.shape[1])

            def write(index: int, block_id: int) -> None:
                payload = payloads[index]
                if payload.numel() != num_bytes:
                    raise InvalidRequestError(
                        f"a pulled KV block has {payload.numel()} bytes, this engine's {num_bytes}"
                    )
                rows[block_id].copy_(payload)

            num_admitted = self.scheduler.kv.admit_blocks(block_hashes, write)
        else:
            return 0  # a gang's other ranks' KV is not reachable here
        self.scheduler.events.flush()
        return num_admitted

    def add_import_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        first_token_id: int | None,
        prompt_chunk_ends: tuple[int, ...] = (),
        cache_salt: str | None = None,
        lora_request: LoRARequest | None = None,
    ) -> ImportAllocation:
        """Reserve blocks for a prompt whose KV will be written from outside (reusing local
        prefix-cache hits); the request decodes after :meth:`mark_kv_ready`. Its outputs
        continue after ``first_token_id``, which the prefill side already returned (None: a
        pipelined import, whose first token arrives with its KV, :meth:`accept_first_token`).
        Should the import fail and the prompt be recomputed here, its chunks end at
        ``prompt_chunk_ends`` (where the prefill replica's chunks ended), so the output is the
        same. ``cache_salt`` and ``lora_request`` must be the prefill's: the imported blocks are
        cached under their hashes, and the decode runs under the same adapter."""
        self.check_request(request_id, prompt_token_ids, params, first_token_id=first_token_id)
        if lora_request is not None:
            self.add_lora(lora_request)
        request = Request(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling_params=params,
            eos_token_ids=self.parts.eos_token_ids,
            cache_salt=cache_salt,
            lora_name=lora_request.lora_name if lora_request is not None else None,
        )
        request.follow_chunk_ends = tuple(prompt_chunk_ends)
        state = self.outputs.new_state(request_id, list(prompt_token_ids), params)
        # NOTE: a non-greedy first token drew from the request's generator on the prefill side.
        generator = request_generator(params, num_draws=0 if params.greedy else 1)
        with self._admitting(request):
            allocation = self.scheduler.add_import_request(request, first_token_id)
            if self.parts.lora is not None and lora_request is not None:
                self.parts.lora.bind(request_id, lora_request)
            self._track(request_id, state, generator)
            if first_token_id is not None:
                self._replay_first_token(request_id, first_token_id)
        return allocation

    def _replay_first_token(self, request_id: str, first_token_id: int) -> None:
        state = self._states[request_id]
        state.token_ids.append(first_token_id)
        # the prefill already sent this token's settled text; replaying it here keeps the
        # bytes of a character it left unfinished, which the next token's text completes
        state.detokenizer.step([first_token_id])
        self.grammars.start(request_id, state.params.structured_output, (first_token_id,))

    def accept_first_token(
        self, request_id: str, first_token_id: int, prompt_chunk_ends: tuple[int, ...] = ()
    ) -> RequestOutput | None:
        """A pipelined import's first token (and the prefill's chunk ends), learnt with its KV.
        None while the request goes on; its final output when the token already ends it (an
        EOS, a stop token, ``max_tokens=1``): then it is over and its blocks are freed."""
        state = self._states.get(request_id)
        if state is None:
            raise InvalidRequestError(f"request {request_id} is not importing", param="request_id")
        ended = self.scheduler.set_first_token(request_id, first_token_id)
        request = self.scheduler.get_request(request_id)
        if request is not None:
            request.follow_chunk_ends = tuple(prompt_chunk_ends)
        self._replay_first_token(request_id, first_token_id)
        if ended is None:
            return None
        output = self.outputs.process(state, ended, None).output
        self._forget(request_id)
        return output

    def mark_kv_ready(self, request_id: str) -> bool:
        """The imported KV is in place: the request joins the batch."""
        return self.scheduler.mark_kv_ready(request_id)

    def mark_kv_failed(self, request_id: str, *, recompute: bool) -> bool:
        """The import failed: recompute the prompt locally (identical output) or end it."""
        if not recompute:
            self._forget(request_id)
        return self.scheduler.mark_kv_failed(request_id, recompute=recompute)

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its KV blocks; False when it is unknown or done."""
        self._forget(request_id)
        return self.scheduler.abort(request_id)

    def close(self) -> None:
        """Release what outlives a step: the KV tiers' I/O threads (pending disk writes are
        finished) and the disk tier's directory lock, the shared KV segment's name, and a
        tensor-parallel gang's followers. Requests still queued stay queued."""
        self.scheduler.close()
        self.parts.storage.close()
        self.runner.close()

    @property
    def rank_storages(self) -> tuple[KVStorage, ...]:
        """Every tensor-parallel rank's KV storage, this engine's (rank 0's) first, as the
        transfer layer of a prefill or decode replica moves their heads; :class:`ConfigError`
        when a rank's KV cannot be reached from here (a follower's is not in shared memory)."""
        storages = self.runner.rank_storages
        size = self.parts.layout.tp_size
        if len(storages) != size:
            raise ConfigError(
                f"{size - len(storages)} of this engine's {size} tensor-parallel ranks keep their "
                f"KV outside shared memory ({SHM_DIR} too small?): it cannot move KV to or from "
                "another pool",
                param="tensor_parallel_size",
            )
        return storages

    @property
    def usable(self) -> bool:
        """False once no step can succeed again (its tensor-parallel gang lost a rank): the
        caller should stop this engine and start a new one."""
        return self.runner.usable

    def has_unfinished(self) -> bool:
        """True while any request is queued, running, or waiting for imported KV, or a step
        still on the device holds outputs of a request not yet ended (a step whose requests
        were all aborted has nothing left to deliver)."""
        if self.scheduler.has_unfinished():
            return True
        step = self._in_flight
        return step is not None and any(
            item.request_id in self._states for item in step.plan.scheduled
        )

    def step(self) -> list[RequestOutput]:
        """Run one scheduler step; returns an output for every request it advanced or ended.

        With overlapped steps (``async_scheduling``) the step is queued on the device and the
        outputs returned are the previous step's: the host reads a step's sampled ids only
        after it has queued the next one (:mod:`engine.step_overlap`).

        Should the step raise after planning (forward, sampling, output processing), every
        request in the plan (and in the step still in flight) is aborted — its blocks freed,
        pinned ones included — and the error propagates: nothing the failed step touched stays
        in the engine."""
        plan = self.scheduler.schedule()
        if plan.is_empty:
            if self._in_flight is None:
                self.scheduler.wait_for_loads(_LOAD_WAIT_S)
                return self._take_failed()
            outputs = self._guarded(plan, self._settle_in_flight)
        else:
            outputs = self._guarded(plan, lambda: self._run(plan))
        return outputs + self._take_failed()

    def _guarded(
        self, plan: SchedulerOutput, body: Callable[[], list[RequestOutput]]
    ) -> list[RequestOutput]:
        try:
            return body()
        except BaseException as e:
            in_flight, self._in_flight = self._in_flight, None
            self._failed.clear()  # the whole step failed: its callers learn it from the error
            self._fail_plan(plan, e)
            if in_flight is not None:
                self._fail_plan(in_flight.plan, e)
            raise

    def _run(self, plan: SchedulerOutput) -> list[RequestOutput]:
        started_s = time.perf_counter()
        outputs: list[RequestOutput] = []
        previous = self._in_flight
        if previous is not None and needs_host_before(plan):
            outputs = self._settle_in_flight()  # structured output, penalties: settle first
        step = self._launch(plan, previous)
        if previous is not None and self._in_flight is previous:
            outputs = self._settle_in_flight()
        if self.async_scheduling and not self._ends_prefill(plan):
            self._in_flight = step
        else:
            outputs += self._settle(step)
            if self.speculation is not None:  # its drafts pay by this measurement
                self.speculation.step_done(plan, time.perf_counter() - started_s)
        return outputs

    def _launch(self, plan: SchedulerOutput, previous: InFlightStep | None) -> InFlightStep:
        """Queue ``plan``'s forward, sampling and the read-back of its samples; waits for
        nothing (inputs still on the device come from ``previous``'s samples)."""
        now = time.monotonic()
        for item in plan.scheduled:
            if (state := self._states.get(item.request_id)) is not None:
                state.scheduled(now)
        self.runner.release(plan.finished_request_ids + plan.preempted_request_ids)
        pending = previous.pending_tokens() if previous is not None else None
        logits = self.runner.execute(plan.scheduled, pending)  # a failure here is the batch's
        sample: DeviceSample | None = None
        read = None
        request_ids = logits.request_ids
        if request_ids:
            sample, request_ids = self._sample_isolating_requests(plan, logits)
            if sample is not None:
                read = self.reader.start(sample.tensors())
        verified = {}
        if logits.verify_logits and self.speculation is not None:
            verified = self.speculation.verify(
                plan, logits.verify_logits, self._sampling_row, self._fail_request
            )
        return InFlightStep(
            plan,
            request_ids,
            logits.prompt_logits,
            sample,
            read,
            time.perf_counter(),
            verified=verified,
        )

    def _sample_isolating_requests(
        self, plan: SchedulerOutput, logits: StepLogits
    ) -> tuple[DeviceSample | None, list[str]]:
        """Queue the sampling of every request that samples this step; a request whose own row
        fails (its sampling options, grammar, penalties, generator) fails alone. Returns the
        sample and the requests it covers, in row order."""
        by_id = {item.request_id: item for item in plan.scheduled}
        rows: list[SamplingRow] = []
        row_ids: list[str] = []
        kept: list[int] = []
        for i, request_id in enumerate(logits.request_ids):
            try:
                row = self._sampling_row(by_id[request_id])
            except Exception as e:
                self._fail_request(request_id, f"its sampling options failed: {e!r}")
                continue
            rows.append(row)
            row_ids.append(request_id)
            kept.append(i)
        if not rows:
            return None, []
        values = logits.logits
        if len(kept) < len(logits.request_ids):
            values = values.index_select(0, upload(kept, torch.long, values.device))
        isolated = self.sampler.sample_isolating_rows(values, rows)
        for i, error in isolated.failures.items():
            self._fail_request(row_ids[i], f"sampling it failed: {error!r}")
        return isolated.sample, [row_ids[i] for i in isolated.kept]

    def _settle_in_flight(self) -> list[RequestOutput]:
        step, self._in_flight = self._in_flight, None
        return [] if step is None else self._settle(step)

    def _settle(self, step: InFlightStep) -> list[RequestOutput]:
        """Read ``step``'s samples (the one host wait of a step) and apply them."""
        sampled = step.read_samples()
        self.prefill_rate.record(step.plan.scheduled, time.perf_counter() - step.launched_s)
        for request_id, (start, prompt_rows) in step.prompt_logits.items():
            if request_id in self._states:
                try:
                    self.outputs.add_prompt_logprobs(self._states[request_id], start, prompt_rows)
                except Exception as e:
                    self._fail_request(request_id, f"its prompt logprobs failed: {e!r}")
        tokens, logprobs, accepted = self._step_tokens(step, sampled)
        results: list[RequestOutput] = []
        for update in self.scheduler.update_from_output(step.plan, tokens, accepted):
            state = self._states.get(update.request_id)
            if state is None:
                continue
            try:
                processed = self.outputs.process_tokens(
                    state, update, logprobs.get(update.request_id, ())
                )
            except Exception as e:
                self._fail_request(update.request_id, f"processing its output failed: {e!r}")
                continue
            if processed.stop_string is not None:
                self.scheduler.finish(update.request_id, FinishReason.STOP, processed.stop_string)
            if processed.output.finished:
                self._forget(update.request_id)
            results.append(processed.output)
        if self.speculation is not None:
            self.speculation.propose(results, self._params_of, self.scheduler)
        return results

    def _params_of(self, request_id: str) -> SamplingParams | None:
        state = self._states.get(request_id)
        return None if state is None else state.params

    def _step_tokens(
        self, step: InFlightStep, sampled: SamplerOutput
    ) -> tuple[dict[str, int], dict[str, Sequence[TokenLogprob | None]], dict[str, int]]:
        """Each request's token (the last of a verify row's), its tokens' logprobs and, for
        verify rows, how many drafts were accepted; requests whose logits are not finite, or
        whose grammar refuses the token, fail alone."""
        tokens: dict[str, int] = {}
        logprobs: dict[str, Sequence[TokenLogprob | None]] = {}
        accepted: dict[str, int] = {}
        for request_id, verified in step.verified.items():
            if not verified.finite:
                self._fail_request(request_id, "the model's logits for it are not finite (NaN/inf)")
                continue
            tokens[request_id] = verified.token_ids[-1]
            accepted[request_id] = verified.num_accepted
            logprobs[request_id] = verified.logprobs
        for request_id, token_id, logprob, finite in zip(
            step.request_ids, sampled.token_ids, sampled.logprobs, sampled.finite, strict=True
        ):
            if not finite:
                self._fail_request(request_id, "the model's logits for it are not finite (NaN/inf)")
                continue
            try:
                self.grammars.accept_one(request_id, token_id)
            except Exception as e:
                self._fail_request(request_id, f"its grammar failed on token {token_id}: {e!r}")
                continue
            tokens[request_id], logprobs[request_id] = token_id, (logprob,)
        return tokens, logprobs, accepted

    def _ends_prefill(self, plan: SchedulerOutput) -> bool:
        """True when a prefill-only request samples its first token in ``plan``: its blocks are
        pinned and exported right after, so that step is settled at once."""
        for item in plan.scheduled:
            request = self.scheduler.get_request(item.request_id)
            if item.samples_token and request is not None and request.prefill_only:
                return True
        return False

    def _fail_request(self, request_id: str, cause: str) -> None:
        """End one request with an error (``finish_reason`` ``"error"``), its blocks freed,
        while the rest of its step goes on; its final output goes out with the step's."""
        state = self._states.get(request_id)
        logger.warning("request %s failed alone: %s", request_id, cause)
        self.scheduler.finish(request_id, FinishReason.ERROR)
        self._forget(request_id)
        if state is not None:
            self._failed.append(self.outputs.failed(state, f"request {request_id}: {cause}"))

    def _take_failed(self) -> list[RequestOutput]:
        failed, self._failed = self._failed, []
        return failed

    def _fail_plan(self, plan: SchedulerOutput, error: BaseException) -> None:
        request_ids = [item.request_id for item in plan.scheduled]
        logger.error(
            "engine step failed for the whole batch, not for one request (%r); aborting "
            "requests %s",
            error,
            request_ids,
        )
        for request_id in request_ids:
            try:
                self.abort(request_id)
            except Exception:
                logger.exception("request %s: abort after a failed step raised", request_id)

    def _sampling_row(self, item: ScheduledRequest) -> SamplingRow:
        params = item.sampling_params
        generator = self._generators.get(item.request_id)
        request = self.scheduler.get_request(item.request_id) if params.penalized else None
        return SamplingRow(
            params=params,
            num_generated_tokens=item.num_output_tokens,
            eos_token_ids=() if params.ignore_eos else self.parts.eos_token_ids,
            generator=generator,
            grammar=self.grammars.get(item.request_id),
            prompt_token_ids=request.prompt_token_ids if request is not None else (),
            output_token_ids=request.output_token_ids if request is not None else (),
        )

    @contextlib.contextmanager
    def _admitting(self, request: Request) -> Iterator[None]:
        """Undo a half-done admission: if the body raises (any type) once the scheduler holds
        ``request``, abort it and forget its state, then re-raise. A same-id request admitted
        earlier (a duplicate-id refusal) is left alone."""
        try:
            yield
        except BaseException:
            if self.scheduler.get_request(request.request_id) is request:
                logger.warning(
                    "request %s: admission failed after queueing; aborting it", request.request_id
                )
                self.abort(request.request_id)
            raise

    def _track(
        self, request_id: str, state: RequestState, generator: torch.Generator | None
    ) -> None:
        self._states[request_id] = state
        if generator is not None:
            self._generators[request_id] = generator

    def _forget(self, request_id: str) -> None:
        if self.speculation is not None:
            self.speculation.forget(request_id)
        if self.parts.lora is not None:
            self.parts.lora.unbind(request_id)
        self._states.pop(request_id, None)
        self._generators.pop(request_id, None)
        self.grammars.forget(request_id)
