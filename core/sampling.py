"""Sampling parameters, validated at construction with errors that name the field."""

from __future__ import annotations

from dataclasses import dataclass, field

from core.errors import SamplingParamsError


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request (the vLLM/OpenAI knobs that pdserve supports).

    ``temperature == 0`` means greedy. ``top_k <= 0`` disables top-k. ``stop`` strings are
    matched on the detokenized text and are not emitted; ``stop_token_ids`` end the request
    (the stop token itself is not part of the text). ``logprobs`` asks for the top-n
    log-probabilities of each sampled position (``None``: none).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        # NOTE: frozen dataclass; normalise list inputs to tuples so the object stays hashable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        self._validate()

    def _validate(self) -> None:
        _check(
            isinstance(self.max_tokens, int) and self.max_tokens >= 1,
            "max_tokens",
            f"max_tokens must be an integer >= 1, got {self.max_tokens!r}",
        )
        _check(
            self.temperature >= 0.0,
            "temperature",
            f"temperature must be >= 0, got {self.temperature!r}",
        )
        _check(0.0 < self.top_p <= 1.0, "top_p", f"top_p must be in (0, 1], got {self.top_p!r}")
        _check(
            isinstance(self.top_k, int) and self.top_k >= -1,
            "top_k",
            f"top_k must be an integer >= -1 (0 or -1 disables it), got {self.top_k!r}",
        )
        _check(
            self.min_tokens >= 0, "min_tokens", f"min_tokens must be >= 0, got {self.min_tokens}"
        )
        _check(
            self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
        )
        _check(
            self.seed is None or isinstance(self.seed, int),
            "seed",
            f"seed must be an integer, got {self.seed!r}",
        )
        _check(
            all(isinstance(s, str) and s for s in self.stop),
            "stop",
            "stop must be a list of non-empty strings",
        )
        _check(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            "stop_token_ids must be non-negative integers",
        )
        _check(
            self.logprobs is None or 0 <= self.logprobs <= 20,
            "logprobs",
            f"logprobs must be between 0 and 20, got {self.logprobs!r}",
        )

    @property
    def greedy(self) -> bool:
        """True when the highest-probability token is always chosen."""
        return self.temperature == 0.0


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise SamplingParamsError(message, param=param)
