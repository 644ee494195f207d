"""Load-test workloads (`pdserve bench --workload FILE`, configs/loadtest/*.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from core.config.base import StrictModel
from loadtest.config.fault_events import FaultControlConfig, FaultEventConfig


class LengthConfig(StrictModel):
    """A token-length distribution, clipped to ``[min_tokens, max_tokens]``."""

    distribution: Literal["fixed", "uniform", "lognormal"] = Field(
        "uniform", description="fixed: always `tokens`; uniform: vLLM's range ratio; lognormal."
    )
    tokens: int = Field(..., ge=1, description="The fixed value, the uniform mean or the median.")
    range_ratio: float = Field(
        0.0, ge=0.0, lt=1.0, description="uniform: draw from [tokens*(1-r), tokens*(1+r)]."
    )
    sigma: float = Field(1.0, gt=0.0, description="lognormal: standard deviation of ln(tokens).")
    min_tokens: int = Field(1, ge=1, description="Lower clip of every draw.")
    max_tokens: int | None = Field(None, ge=1, description="Upper clip of every draw; None: none.")

    @model_validator(mode="after")
    def _clip_is_ordered(self) -> LengthConfig:
        if self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise ValueError(f"max_tokens ({self.max_tokens}) < min_tokens ({self.min_tokens})")
        return self


def _length(tokens: int) -> LengthConfig:
    return LengthConfig.model_validate({"tokens": tokens})


class RandomWorkloadConfig(StrictModel):
    """Independent random prompts (vLLM's `random` dataset); long-context presets use it too."""

    kind: Literal["random"] = Field("random", description="Workload type tag.")
    input_len: LengthConfig = Field(
        default_factory=lambda: _length(1024),
        description="Prompt tokens after the shared prefix.",
    )
    output_len: LengthConfig = Field(
        default_factory=lambda: _length(128), description="max_tokens per request."
    )
    prefix_len_tokens: int = Field(
        0, ge=0, description="Tokens of one prefix shared by every prompt (--random-prefix-len)."
    )


class SharedPrefixWorkloadConfig(StrictModel):
    """Groups of users sharing a system prompt: prompt = group prefix + a unique suffix."""

    kind: Literal["shared-prefix"] = Field("shared-prefix", description="Workload type tag.")
    num_groups: int = Field(4, ge=1, description="Distinct shared prefixes (system prompts).")
    prefix_len_tokens: int = Field(1024, ge=1, description="Tokens of each group's prefix.")
    suffix_len: LengthConfig = Field(
        default_factory=lambda: _length(128), description="Unique per-request tokens."
    )
    output_len: LengthConfig = Field(
        default_factory=lambda: _length(128), description="max_tokens per request."
    )


class LongShortMixWorkloadConfig(StrictModel):
    """Long prompts among short requests: how much do long prefills hurt the short ones?

    Long requests are spread evenly (request ``i`` is long when ``floor((i + 1) * f)`` exceeds
    ``floor(i * f)``), so every stretch of the run carries its share; the summary reports the
    short requests' TTFT and ITL while a long prompt prefills apart from the rest.
    """

    kind: Literal["long-short-mix"] = Field("long-short-mix", description="Workload type tag.")
    long_fraction: float = Field(0.1, gt=0.0, lt=1.0, description="Share of long requests.")
    long_input_len: LengthConfig = Field(
        default_factory=lambda: _length(16384), description="Prompt tokens of a long request."
    )
    long_output_len: LengthConfig = Field(
        default_factory=lambda: _length(16), description="max_tokens of a long request."
    )
    short_input_len: LengthConfig = Field(
        default_factory=lambda: _length(128), description="Prompt tokens of a short request."
    )
    short_output_len: LengthConfig = Field(
        default_factory=lambda: _length(64), description="max_tokens of a short request."
    )


class MultiTurnWorkloadConfig(StrictModel):
    """Chat sessions: each turn resends the whole history (earlier turns and answers)."""

    kind: Literal["multi-turn"] = Field("multi-turn", description="Workload type tag.")
    num_turns: int = Field(4, ge=1, description="Requests per session.")
    system_prompt_len_tokens: int = Field(
        0, ge=0, description="Tokens of a system prompt shared by all sessions (0: none)."
    )
    user_len: LengthConfig = Field(
        default_factory=lambda: _length(256), description="New user tokens per turn."
    )
    output_len: LengthConfig = Field(
        default_factory=lambda: _length(128), description="max_tokens per turn."
    )
    think_time_s: float = Field(
        1.0, ge=0.0, description="Mean pause between an answer and the session's next turn."
    )
    think_time_distribution: Literal["fixed", "exponential"] = Field(
        "exponential", description="How think times are drawn around think_time_s."
    )


class TraceWorkloadConfig(StrictModel):
    """Replay of a Mooncake JSONL trace (timestamp, input_length, output_length, hash_ids)."""

    kind: Literal["mooncake-trace"] = Field("mooncake-trace", description="Workload type tag.")
    path: str = Field(..., description="JSONL trace; a relative path resolves against the YAML.")
    block_size_tokens: int = Field(512, ge=1, description="Prompt tokens per hash id.")
    timestamp_unit: Literal["ms", "s"] = Field("ms", description="Unit of `timestamp`.")
    time_scale: float = Field(
        1.0, gt=0.0, description="Multiplies trace times (0.5 replays twice as fast)."
    )
    max_output_tokens: int | None = Field(
        None, ge=1, description="Cap on each request's output_length; None: the trace's value."
    )


class ArrivalConfig(StrictModel):
    """When requests (sessions, for multi-turn) start, and how many run at once."""

    request_rate: float = Field(
        float("inf"), gt=0.0, description="Mean arrivals per second; inf: all at time 0."
    )
    burstiness: float = Field(
        1.0, gt=0.0, description="Gamma shape of inter-arrival gaps: 1 Poisson, <1 burstier."
    )
    max_concurrency: int | None = Field(
        None, ge=1, description="Most requests in flight at once; None: unbounded."
    )
    num_requests: int = Field(
        1000, ge=1, description="Requests to send (sessions, for multi-turn workloads)."
    )
    duration_s: float | None = Field(
        None, gt=0.0, description="Stop starting new requests after this; num_requests still caps."
    )
    ramp_up_strategy: Literal["linear", "exponential"] | None = Field(
        None, description="Raise the rate from ramp_up_start_rps to ramp_up_end_rps over the run."
    )
    ramp_up_start_rps: float | None = Field(None, ge=0.0, description="Ramp-up first rate.")
    ramp_up_end_rps: float | None = Field(None, gt=0.0, description="Ramp-up last rate.")
    seed: int = Field(0, description="Seed of arrival gaps, lengths and prompt text.")

    @model_validator(mode="after")
    def _ramp_up_is_complete(self) -> ArrivalConfig:
        if self.ramp_up_strategy is None:
            return self
        start, end = self.ramp_up_start_rps, self.ramp_up_end_rps
        if start is None or end is None:
            raise ValueError("ramp_up_strategy needs ramp_up_start_rps and ramp_up_end_rps")
        if start > end:
            raise ValueError(f"ramp_up_start_rps ({start}) > ramp_up_end_rps ({end})")
        if self.ramp_up_strategy == "exponential" and start <= 0.0:
            raise ValueError("exponential ramp-up needs ramp_up_start_rps > 0")
        if self.request_rate != float("inf"):
            raise ValueError("set either request_rate or a ramp-up, not both")
        return self


class SloConfig(StrictModel):
    """Per-request service-level objectives; goodput counts requests meeting all that are set."""

    ttft_ms: float | None = Field(None, ge=0.0, description="Time to first token bound.")
    tpot_ms: float | None = Field(None, ge=0.0, description="Time per output token bound.")
    e2el_ms: float | None = Field(None, ge=0.0, description="End-to-end latency bound.")


class SweepConfig(StrictModel):
    """Repeat the run at rising load to find the throughput knee."""

    mode: Literal["concurrency", "rate"] = Field(
        "concurrency", description="What rises: max_concurrency or request_rate."
    )
    values: list[float] | None = Field(
        None, min_length=1, description="Load levels in order; None: 1, 2, 4, ... (max_steps)."
    )
    max_steps: int = Field(6, ge=1, le=20, description="Levels tried when values is None.")
    min_gain: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="Knee: last level whose relative throughput gain is >= min_gain x its "
        "relative load increase.",
    )


class LoadTestTargetConfig(StrictModel):
    """The OpenAI-compatible server under test and per-request options."""

    base_url: str = Field("http://127.0.0.1:8000", description="Server root URL.")
    endpoint: str = Field("/v1/completions", description="/v1/completions or /v1/chat/completions.")
    model: str | None = Field(None, description="Model name sent; None: first of /v1/models.")
    tokenizer: str | None = Field(
        None,
        description="tokenizer.json, a dir holding one, or a GGUF file (its tokenizer is rebuilt "
        "from the metadata; needs the gguf package), for exact prompt token counts.",
    )
    ignore_eos: bool = Field(False, description="Ask the server to ignore EOS (send ignore_eos).")
    temperature: float | None = Field(None, ge=0.0, description="Sent when set.")
    request_timeout_s: float = Field(600.0, gt=0.0, description="Bound on one whole request.")


class LoadTestConfig(StrictModel):
    """One load-test run: target, workload, arrivals, SLOs and an optional sweep."""

    name: str = Field("bench", description="Label of the run (result file names).")
    target: LoadTestTargetConfig = Field(
        default_factory=lambda: LoadTestTargetConfig.model_validate({}),
        description="Server and request options.",
    )
    workload: (
        RandomWorkloadConfig
        | SharedPrefixWorkloadConfig
        | MultiTurnWorkloadConfig
        | TraceWorkloadConfig
        | LongShortMixWorkloadConfig
    ) = Field(
        default_factory=lambda: RandomWorkloadConfig.model_validate({}),
        discriminator="kind",
        description="What prompts look like.",
    )
    arrivals: ArrivalConfig = Field(
        default_factory=lambda: ArrivalConfig.model_validate({}),
        description="Arrival process and limits.",
    )
    slo: SloConfig = Field(
        default_factory=lambda: SloConfig.model_validate({}), description="Goodput objectives."
    )
    sweep: SweepConfig | None = Field(None, description="Find the throughput knee; None: one run.")
    events: list[FaultEventConfig] = Field(
        default_factory=list, description="Faults injected during the run (a schedule)."
    )
    control: FaultControlConfig = Field(
        default_factory=lambda: FaultControlConfig.model_validate({}),
        description="Where scale events act, and how recovery is judged.",
    )

    @model_validator(mode="after")
    def _trace_owns_its_timing(self) -> LoadTestConfig:
        timed = self.arrivals.request_rate != float("inf") or self.arrivals.ramp_up_strategy
        if isinstance(self.workload, TraceWorkloadConfig) and timed:
            raise ValueError("a trace replay follows its timestamps: drop request_rate/ramp-up")
        sweeps_rate = self.sweep is not None and self.sweep.mode == "rate"
        if isinstance(self.workload, TraceWorkloadConfig) and sweeps_rate:
            raise ValueError("a trace replay cannot sweep the request rate")
        if self.events and self.sweep is not None:
            raise ValueError("a fault schedule runs once: drop sweep or events")
        return self


_MIB = 1024 * 1024
