"""Sampling parameters, validated at construction with errors that name the field."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from core.errors import SamplingParamsError

MIN_SEED = -(2**63)
MAX_SEED = 2**63 - 1
"""``seed`` is any signed 64-bit integer, vLLM's range (some clients send -1 for "random"; it
is a seed like any other here). The engine maps it onto its generator's unsigned 64-bit seed by
two's complement (:func:`generator_seed`), one seed to one generator state."""
_SEED_SPAN = 2**64
_MAX_INT64 = 2**63 - 1  # integer fields reach torch as int64
_MAX_FLOAT32 = 3.4028234663852886e38  # float fields reach torch as float32


StructuredKind = Literal["json", "json_object", "regex", "choice", "grammar"]


@dataclass(frozen=True)
class StructuredOutput:
    """Output constrained by a grammar: a JSON schema (``json``, the schema as JSON text), any
    JSON object, a regular expression, one of fixed strings (``choice``, a JSON list), or an
    EBNF grammar. ``param`` is the request field it came from, named by errors about it."""

    kind: StructuredKind
    spec: str = ""
    param: str = "response_format"


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens for one request (the vLLM/OpenAI knobs that pdserve supports).

    ``temperature == 0`` means greedy. ``top_k <= 0`` disables top-k. ``stop`` strings are
    matched on the detokenized text and are not emitted; ``stop_token_ids`` end the request
    (the stop token itself is not part of the text). ``logprobs`` asks for the top-n
    log-probabilities of each sampled position (``None``: none); ``prompt_logprobs`` for each
    prompt token's (such a request computes its whole prompt: no prefix-cache hit).
    ``seed`` (``MIN_SEED`` .. ``MAX_SEED``, any signed 64-bit integer) gives the request its own
    generator, so its samples do not depend on its batch neighbours.
    ``n`` completions per prompt are produced by ``LLM.generate`` (one engine request each;
    sequence ``i`` of a seeded prompt samples with :func:`sequence_seed`); an engine request
    itself always has ``n == 1``. ``kv_keep_alive_s`` asks the engine to keep the request's
    cached KV past the idle TTLs for that many seconds after it ends (a session expecting its
    next turn); the engine bounds it by ``engine.kv_tiers.max_keep_alive_s``.
    ``structured_output`` constrains the output to a grammar; the grammar then decides where the
    output may end (``min_tokens`` does not hold a complete one open).
    ``skip_special_tokens`` leaves special tokens (EOS, BOS, ...) out of the text;
    ``include_stop_str_in_output`` keeps a matched stop string at the end of the text (vLLM's
    names and defaults).
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
    prompt_logprobs: int | None = None
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias added to its logit) pairs; a dict ``{id: bias}`` is accepted."""
    structured_output: StructuredOutput | None = None
    kv_keep_alive_s: float | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    extra: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        # NOTE: frozen dataclass; normalise list inputs to tuples so the object stays hashable.
        object.__setattr__(self, "stop", _as_tuple(self.stop, "stop", single=str))
        object.__setattr__(self, "stop_token_ids", _as_tuple(self.stop_token_ids, "stop_token_ids"))
        object.__setattr__(self, "logit_bias", _bias_pairs(self.logit_bias))
        self._validate_lengths()
        self._validate_distribution()
        self._validate_stops()
        self._validate_penalties()

    def _validate_lengths(self) -> None:
        _check(
            _is_int(self.n) and 1 <= self.n <= _MAX_INT64,
            "n",
            f"n must be an integer in [1, 2**63 - 1], got {self.n!r}",
        )
        _check(
            _is_int(self.max_tokens) and 1 <= self.max_tokens <= _MAX_INT64,
            "max_tokens",
            f"max_tokens must be an integer in [1, 2**63 - 1], got {self.max_tokens!r}",
        )
        _check(
            _is_int(self.min_tokens) and 0 <= self.min_tokens <= _MAX_INT64,
            "min_tokens",
            f"min_tokens must be an integer in [0, 2**63 - 1], got {self.min_tokens!r}",
        )
        _check(
            self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
        )

    def _validate_distribution(self) -> None:
        _check(
            _is_real(self.temperature) and self.temperature >= 0.0,
            "temperature",
            f"temperature must be a finite number >= 0, got {self.temperature!r}",
        )
        _check(
            _is_real(self.top_p) and 0.0 < self.top_p <= 1.0,
            "top_p",
            f"top_p must be a number in (0, 1], got {self.top_p!r}",
        )
        _check(
            _is_int(self.top_k) and -1 <= self.top_k <= _MAX_INT64,
            "top_k",
            f"top_k must be an integer in [-1, 2**63 - 1] (0 or -1: off), got {self.top_k!r}",
        )
        _check(
            self.seed is None or (_is_int(self.seed) and MIN_SEED <= self.seed <= MAX_SEED),
            "seed",
            f"seed must be a signed 64-bit integer in [-2**63, 2**63 - 1], got {self.seed!r}",
        )
        _check(
            self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= 20),
            "logprobs",
            f"logprobs must be an integer between 0 and 20, got {self.logprobs!r}",
        )
        _check(
            self.prompt_logprobs is None
            or (_is_int(self.prompt_logprobs) and 0 <= self.prompt_logprobs <= 20),
            "prompt_logprobs",
            f"prompt_logprobs must be an integer between 0 and 20, got {self.prompt_logprobs!r}",
        )

    def _validate_stops(self) -> None:
        _check(
            all(isinstance(s, str) and s for s in self.stop),
            "stop",
            "stop must be a list of non-empty strings",
        )
        _check(
            all(_is_int(t) and 0 <= t <= _MAX_INT64 for t in self.stop_token_ids),
            "stop_token_ids",
            "stop_token_ids must be non-negative integers",
        )
        _check(
            self.kv_keep_alive_s is None
            or (isinstance(self.kv_keep_alive_s, int | float) and self.kv_keep_alive_s >= 0),
            "kv_keep_alive_s",
            f"kv_keep_alive_s must be a number of seconds >= 0, got {self.kv_keep_alive_s!r}",
        )
        _check(
            isinstance(self.ignore_eos, bool),
            "ignore_eos",
            f"ignore_eos must be a boolean, got {self.ignore_eos!r}",
        )

    def _validate_penalties(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(
                _is_real(value) and -2.0 <= value <= 2.0,
                name,
                f"{name} must be a number in [-2, 2], got {value!r}",
            )
        _check(
            _is_real(self.repetition_penalty) and 0.0 < self.repetition_penalty <= 2.0,
            "repetition_penalty",
            f"repetition_penalty must be a number in (0, 2], got {self.repetition_penalty!r}",
        )
        for token_id, bias in self.logit_bias:
            _check(
                -100.0 <= bias <= 100.0,
                "logit_bias",
                f"logit_bias values must be in [-100, 100], got {bias!r} for token {token_id}",
            )

    @property
    def held_open_for(self) -> int:
        """Output tokens before a stop token may end the request: ``min_tokens``, or 0 under a
        grammar (which decides where constrained output ends)."""
        return 0 if self.structured_output is not None else self.min_tokens

    @property
    def penalized(self) -> bool:
        """True when a presence, frequency or repetition penalty changes the logits."""
        return bool(self.presence_penalty or self.frequency_penalty) or (
            self.repetition_penalty != 1.0
        )

    @property
    def greedy(self) -> bool:
        """True when the highest-probability token is always chosen."""
        return self.temperature == 0.0


def sequence_seed(seed: int | None, index: int) -> int | None:
    """The seed of sequence ``index`` of a prompt seeded with ``seed``: ``seed + index``,
    wrapped into the signed 64-bit range (None stays None)."""
    if seed is None:
        return None
    return (seed + index - MIN_SEED) % _SEED_SPAN + MIN_SEED


def generator_seed(seed: int) -> int:
    """``seed`` as an unsigned 64-bit generator seed (two's complement: -1 -> 2**64 - 1), so a
    negative seed is as deterministic as any other and no two seeds share a generator."""
    return seed % _SEED_SPAN


def _is_int(value: object) -> bool:
    """An ``int`` that is not a ``bool`` (``True`` would pass for 1 otherwise)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    """An ``int`` or ``float`` (not a ``bool``) that stays finite as a float32."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        as_float = float(value)
    except OverflowError:  # an int past the float range
        return False
    return math.isfinite(as_float) and abs(as_float) <= _MAX_FLOAT32


def _as_tuple(value: object, param: str, *, single: type | None = None) -> tuple[object, ...]:
    """``value`` as a tuple; a lone ``single`` (e.g. one stop string) becomes a 1-tuple."""
    if single is not None and isinstance(value, single):
        return (value,)
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise SamplingParamsError(f"{param} must be a list, got {value!r}", param=param)
    return tuple(value)


def _bias_pairs(value: object) -> tuple[tuple[int, float], ...]:
    """``logit_bias`` as sorted (id, bias) pairs, from pairs or an OpenAI-style dict whose keys
    may be token ids written as strings."""
    items = value.items() if isinstance(value, Mapping) else _as_tuple(value, "logit_bias")
    pairs: dict[int, float] = {}
    for item in items:
        parts = tuple(item) if isinstance(item, tuple | list) else ()
        key: object = parts[0] if len(parts) == 2 else None
        bias: object = parts[1] if len(parts) == 2 else None
        if isinstance(key, str) and key.strip().isdigit():
            key = int(key)
        if not _is_int(key) or key < 0 or not _is_real(bias):  # type: ignore[operator]
            raise SamplingParamsError(
                f"logit_bias must map token ids (integers >= 0) to numbers, got {item!r}",
                param="logit_bias",
            )
        pairs[key] = float(bias)  # type: ignore[index, arg-type]
    return tuple(sorted(pairs.items()))


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise SamplingParamsError(message, param=param)
