"""The capacity model ``pdserve profile`` measures and the ``slo`` planner reads.

Two curves, measured on one replica of each role with the cluster's own model and engine
options: prefill — the wall time to prefill a batch of prompts of a given length (so TTFT on an
idle replica and tokens/s at each batch size); decode — the time of one decode step (the
inter-token latency) with a given number of running sequences at a given context length.
Queries interpolate linearly between measured points; past the last point prefill time grows in
proportion to the prompt length and ITL along the last measured slope (both pessimistic enough
to size for, never an optimistic clamp). The model is a frozen dataclass written as JSON
through ``core.codec``; ``load`` names the file and the field when it is not one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.codec import from_plain, to_plain
from core.errors import ConfigError, MessageError


@dataclass(frozen=True)
class PrefillPoint:
    """``batch`` prompts of ``prompt_len`` tokens prefilled together in ``seconds``."""

    prompt_len: int
    batch: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.prompt_len * self.batch / self.seconds


@dataclass(frozen=True)
class DecodePoint:
    """One decode step with ``concurrency`` sequences of about ``context_len`` tokens."""

    concurrency: int
    context_len: int
    itl_s: float


@dataclass(frozen=True)
class CapacityModel:
    """What one replica of each role can do on this hardware with this model."""

    model: str
    device: str
    prefill: tuple[PrefillPoint, ...]
    decode: tuple[DecodePoint, ...]
    max_num_seqs: int | None = None
    """The profiled decode engine's ``max_num_seqs``: no replica runs more, however fast."""

    def __post_init__(self) -> None:
        if not any(p.batch == 1 for p in self.prefill):
            raise ValueError("a capacity model needs prefill points at batch 1")
        if not self.decode:
            raise ValueError("a capacity model needs decode points")
        bad = [p for p in self.prefill if p.seconds <= 0] + [d for d in self.decode if d.itl_s <= 0]
        if bad:
            raise ValueError(f"capacity model times must be > 0, got {bad[0]}")

    def prefill_seconds(self, prompt_len: float) -> float:
        """Time to prefill one prompt of ``prompt_len`` tokens alone (an idle replica's TTFT)."""
        points = sorted((p.prompt_len, p.seconds) for p in self.prefill if p.batch == 1)
        return _extend_proportional(prompt_len, points)

    def prefill_tokens_per_s(self, prompt_len: float) -> float:
        """Prompt tokens per second one replica sustains at ``prompt_len`` (its best batch)."""
        best: dict[int, float] = {}
        for p in self.prefill:
            best[p.prompt_len] = max(best.get(p.prompt_len, 0.0), p.tokens_per_s)
        lengths = sorted(best)
        return float(np.interp(prompt_len, lengths, [best[n] for n in lengths]))

    def itl_s(self, concurrency: float, context_len: float) -> float:
        """One decode step's time with ``concurrency`` sequences of ``context_len`` tokens."""
        contexts = sorted({d.context_len for d in self.decode})
        per_context = [self._itl_at(concurrency, c) for c in contexts]
        if len(contexts) == 1 or context_len <= contexts[0]:
            return per_context[0]
        if context_len >= contexts[-1]:
            return _extend_slope(context_len, list(zip(contexts, per_context, strict=True)))
        return float(np.interp(context_len, contexts, per_context))

    def max_concurrency(self, itl_target_s: float, context_len: float) -> float:
        """Most sequences one decode replica runs with steps within ``itl_target_s`` (at least
        1: a single sequence is served however slow it is; at most ``max_num_seqs``)."""
        fastest = self._fastest_concurrency(itl_target_s, context_len)
        return fastest if self.max_num_seqs is None else min(fastest, float(self.max_num_seqs))

    def _fastest_concurrency(self, itl_target_s: float, context_len: float) -> float:
        low, high = 1.0, 1.0
        while self.itl_s(high * 2, context_len) <= itl_target_s and high < 1 << 16:
            high *= 2
        high *= 2
        if self.itl_s(low, context_len) > itl_target_s:
            return 1.0
        for _ in range(40):  # bisect: itl_s grows with concurrency
            mid = (low + high) / 2
            low, high = (mid, high) if self.itl_s(mid, context_len) <= itl_target_s else (low, mid)
        return low

    def _itl_at(self, concurrency: float, context_len: int) -> float:
        points = sorted(
            (d.concurrency, d.itl_s) for d in self.decode if d.context_len == context_len
        )
        return _extend_slope(concurrency, points)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(to_plain(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> CapacityModel:
        """The model in ``path``; ConfigError naming ``planner.profile`` otherwise."""
        try:
            return from_plain(cls, json.loads(Path(path).read_text()))
        except (OSError, ValueError, MessageError) as e:
            raise ConfigError(
                f"cannot read the capacity model {str(path)!r}: {e} "
                "(write it with pdserve profile)",
                param="planner.profile",
            ) from e


def _extend_proportional(x: float, points: Sequence[tuple[float, float]]) -> float:
    """Linear between points; past the last, ``y`` grows in proportion to ``x``."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    if x > xs[-1]:
        return ys[-1] * x / xs[-1]
    return float(np.interp(x, xs, ys))


def _extend_slope(x: float, points: Sequence[tuple[float, float]]) -> float:
    """Linear between points; past the last, along the last segment's (non-negative) slope."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    if x <= xs[-1] or len(xs) == 1:
        return float(np.interp(x, xs, ys))
    slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
    return ys[-1] + slope * (x - xs[-1])
