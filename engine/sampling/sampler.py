"""The sampler: one token per row of a logits batch, under each row's own ``SamplingParams``.

Order of operations (vLLM's): logprobs come from the raw logits; then ``logit_bias`` is added,
the presence, frequency and repetition penalties applied (:mod:`engine.sampling.penalties`), a
structured-output row's grammar mask applied (:mod:`engine.sampling.grammar`), and EOS and
stop-token ids masked for rows below ``min_tokens``; greedy rows (temperature < 1e-5)
take the argmax; the other rows are divided by their temperature, filtered by top-k then top-p,
and drawn by inverse-CDF sampling from one uniform per row.

Reproducibility: a seeded request carries its own CPU ``torch.Generator`` (:func:`make_generator`)
that gives exactly one uniform per sampled step, so its tokens depend only on its seed and its
own logits — not on batch neighbours or batch order. Unseeded rows share the sampler's
generator. Greedy rows draw nothing. ``ignore_eos`` does not mask EOS (as in vLLM, EOS may be
sampled and the engine simply does not stop on it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from core.sampling import SamplingParams, generator_seed
from engine.device_io import upload
from engine.outputs import TokenLogprob
from engine.sampling import grammar, ops, penalties
from engine.sampling.row import SamplingRow

GREEDY_TEMPERATURE_EPS = 1e-5


def make_generator(seed: int) -> torch.Generator:
    """A request's private CPU generator for ``SamplingParams.seed`` (any signed 64-bit seed,
    mapped onto the generator's unsigned one by :func:`core.sampling.generator_seed`)."""
    return torch.Generator(device="cpu").manual_seed(generator_seed(seed))


@dataclass(frozen=True)
class SamplerOutput:
    """The step's sampled ids on the host: ``token_ids[i]`` for row i, plus logprobs where
    requested."""

    token_ids: list[int]
    logprobs: list[TokenLogprob | None]
    finite: list[bool]
    """Whether row i's raw logits were all finite (a row with NaN or inf fails its request)."""


@dataclass(frozen=True)
class DeviceSample:
    """A sampled batch still on the device: what :meth:`Sampler.sample_on_device` queued.

    ``token_ids`` [B] int64 feed the next step's inputs where they are (overlapped steps);
    :meth:`tensors` lists what the host must read, and :meth:`to_output` turns the host
    copies of those (in that order) into a :class:`SamplerOutput`.
    """

    token_ids: torch.Tensor  # [B] int64, on the logits' device
    finite: torch.Tensor  # [B] bool: row i's raw logits were all finite
    logprobs: _LogprobTensors | None
    num_logprobs: tuple[int | None, ...]  # each row's ``params.logprobs``

    def tensors(self) -> list[torch.Tensor]:
        """The device tensors the host needs, ids first."""
        if self.logprobs is None:
            return [self.token_ids, self.finite]
        return [self.token_ids, self.finite, *self.logprobs.tensors()]

    def to_output(self, host: Sequence[torch.Tensor]) -> SamplerOutput:
        """The host copies of :meth:`tensors` as lists."""
        token_id_list: list[int] = host[0].tolist()
        logprobs: list[TokenLogprob | None] = [None] * len(token_id_list)
        if self.logprobs is not None:
            logprobs = self.logprobs.rows(host[2:], token_id_list, self.num_logprobs)
        return SamplerOutput(token_ids=token_id_list, logprobs=logprobs, finite=host[1].tolist())


@dataclass(frozen=True)
class IsolatedSample:
    """What :meth:`Sampler.sample_isolating_rows` queued: the sample of the rows ``kept`` (in
    that order; None when no row was kept) and the error of each row that failed alone."""

    sample: DeviceSample | None
    kept: tuple[int, ...]
    failures: dict[int, Exception]


@dataclass(frozen=True)
class _LogprobTensors:
    """Logprobs of the rows that asked for them (``row_indices``), on the device."""

    row_indices: tuple[int, ...]
    chosen: torch.Tensor  # [W] float32
    ranks: torch.Tensor  # [W] int64
    top_ids: torch.Tensor  # [W, n] int64
    top_values: torch.Tensor  # [W, n] float32

    def tensors(self) -> list[torch.Tensor]:
        return [self.chosen, self.ranks, self.top_ids, self.top_values]

    def rows(
        self,
        host: Sequence[torch.Tensor],
        token_id_list: list[int],
        num_logprobs: Sequence[int | None],
    ) -> list[TokenLogprob | None]:
        chosen_list, ranks_list, ids_list, values_list = (t.tolist() for t in host)
        result: list[TokenLogprob | None] = [None] * len(token_id_list)
        for j, i in enumerate(self.row_indices):
            n = num_logprobs[i] or 0
            result[i] = TokenLogprob(
                token_id=token_id_list[i],
                logprob=chosen_list[j],
                rank=ranks_list[j],
                top_token_ids=tuple(ids_list[j][:n]),
                top_logprobs=tuple(values_list[j][:n]),
            )
        return result


class Sampler:
    """Samples a batch of rows; holds only the generator shared by unseeded rows."""

    def __init__(self, seed: int | None = None) -> None:
        self._generator = torch.Generator(device="cpu")
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(generator_seed(seed))

    def sample(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> SamplerOutput:
        """One token per row of ``logits`` [B, V] (float32) following ``rows[i]``, read back
        to the host at once."""
        sampled = self.sample_on_device(logits, rows)
        return sampled.to_output(sampled.tensors())

    def sample_on_device(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> DeviceSample:
        """Queue the sampling of one token per row of ``logits`` [B, V]; nothing waits for the
        device (inputs go up through :func:`~engine.device_io.upload`)."""
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(f"logits {tuple(logits.shape)} do not match {len(rows)} rows")
        logits = logits.float()  # no-op for float32 logits
        processed = grammar.apply_masks(penalties.apply(logits, rows), [r.grammar for r in rows])
        masked = ops.mask_tokens(processed, [banned_token_ids(row) for row in rows])
        token_ids = masked.argmax(dim=-1)  # [B]
        random_rows = [i for i, row in enumerate(rows) if not is_greedy(row.params)]
        if random_rows:
            index = upload(random_rows, torch.long, logits.device)
            drawn = self._sample_random(masked, rows, random_rows, index)
            token_ids.index_copy_(0, index, drawn)
        return DeviceSample(
            token_ids=token_ids,
            # one reduction instead of a [B, V] mask and a second pass: a row's sum is NaN or
            # infinite exactly when one of its logits is (logits never sum past float32's range)
            finite=torch.isfinite(logits.sum(dim=-1)),
            logprobs=_logprobs(logits, token_ids, rows),
            num_logprobs=tuple(row.params.logprobs for row in rows),
        )

    def sample_isolating_rows(
        self, logits: torch.Tensor, rows: Sequence[SamplingRow]
    ) -> IsolatedSample:
        """:meth:`sample_on_device`, except that rows which fail on their own (their grammar,
        penalties, generator, ...) are left out and reported instead of failing the batch.

        The batch is tried first; only when it raises is each row tried alone, every generator
        put back to where it was before each try, so the rows that sample draw exactly what
        they would have drawn without the failing ones. When every row samples alone but the
        batch does not, nothing is attributable to a row: the batch's error is raised.
        """
        failures: dict[int, Exception] = {}
        # NOTE: only rows that draw move a generator; a greedy batch saves no state at all
        drawing = [i for i, row in enumerate(rows) if not is_greedy(row.params)]
        shared = self._generator.get_state() if drawing else None
        saved: dict[int, torch.Tensor] = {}
        for i in drawing:
            row = rows[i]
            if row.generator is not None:
                try:
                    saved[i] = row.generator.get_state()
                except Exception as e:  # not a generator at all: that row cannot sample
                    failures[i] = e
        error: Exception | None = None
        if not failures:
            try:
                sample = self.sample_on_device(logits, rows)
                return IsolatedSample(sample, tuple(range(len(rows))), {})
            except Exception as batch_error:
                error = batch_error
        for i in [i for i in range(len(rows)) if i not in failures]:
            self._restore(rows, shared, saved)
            try:
                self.sample_on_device(logits[i : i + 1], [rows[i]])
            except Exception as e:
                failures[i] = e
        self._restore(rows, shared, saved)
        if not failures:
            assert error is not None  # rows alone only run after the batch raised
            raise error
        kept = tuple(i for i in range(len(rows)) if i not in failures)
        if not kept:
            return IsolatedSample(None, (), failures)
        index = upload(list(kept), torch.long, logits.device)
        sample = self.sample_on_device(logits.index_select(0, index), [rows[i] for i in kept])
        return IsolatedSample(sample, kept, failures)

    def _restore(
        self,
        rows: Sequence[SamplingRow],
        shared: torch.Tensor | None,
        saved: dict[int, torch.Tensor],
    ) -> None:
        """Put the shared generator (when saved) and each row's own back to the states saved."""
        if shared is not None:
            self._generator.set_state(shared)
        for i, state in saved.items():
            generator = rows[i].generator
            assert generator is not None  # saved only for rows that have one
            generator.set_state(state)

    def _sample_random(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplingRow],
        indices: list[int],
        index: torch.Tensor,  # [R] int64, ``indices`` on the device
    ) -> torch.Tensor:
        """Token ids [R] for the non-greedy rows ``indices``."""
        device = logits.device
        params = [rows[i].params for i in indices]
        temperatures, top_ks, top_ps = ops.filter_params(params, device)
        uniforms = self._uniforms([rows[i].generator for i in indices])
        if device.type == "cuda":
            uniforms = uniforms.pin_memory().to(device, non_blocking=True)
        return ops.sample_from_logits(
            logits.index_select(0, index), temperatures, top_ks, top_ps, uniforms
        )

    def draw_uniforms(self, generator: torch.Generator | None, count: int) -> list[float]:
        """``count`` uniforms in [0, 1) from ``generator``, else from the shared one (the
        rejection sampler's draws)."""
        source = self._generator if generator is None else generator
        values: list[float] = torch.rand(count, generator=source, dtype=torch.float64).tolist()
        return values

    def _uniforms(self, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
        """One float64 uniform [R] per row: from its own generator, else the shared one."""
        num_shared = sum(g is None for g in generators)
        shared = iter(torch.rand(num_shared, generator=self._generator, dtype=torch.float64))
        values = [
            next(shared) if g is None else torch.rand(1, generator=g, dtype=torch.float64)[0]
            for g in generators
        ]
        return torch.stack(values) if values else torch.empty(0, dtype=torch.float64)


def is_greedy(params: SamplingParams) -> bool:
    # NOTE: temperatures this small overflow ``logits / t``; they mean greedy in practice.
    return params.temperature < GREEDY_TEMPERATURE_EPS


def banned_token_ids(row: SamplingRow) -> tuple[int, ...]:
    """Ids that may not be sampled now: EOS and stop tokens until ``min_tokens`` is reached."""
    if row.num_generated_tokens >= row.params.held_open_for:
        return ()
    return row.eos_token_ids + row.params.stop_token_ids


def _logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, rows: Sequence[SamplingRow]
) -> _LogprobTensors | None:
    """Logprobs of the raw (unmasked, unscaled) logits for the rows that asked for them."""
    wanted = [i for i, row in enumerate(rows) if row.params.logprobs is not None]
    if not wanted:
        return None
    num_top = max(rows[i].params.logprobs or 0 for i in wanted)
    index = upload(wanted, torch.long, logits.device)
    chosen, ranks, top_ids, top_values = ops.top_logprobs(
        logits.index_select(0, index), token_ids.index_select(0, index), num_top
    )
    return _LogprobTensors(tuple(wanted), chosen, ranks, top_ids, top_values)
