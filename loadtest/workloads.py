"""Turn a workload config into a (possibly endless) stream of sessions to send.

Random, shared-prefix and long-short-mix sessions are one request each; multi-turn sessions hold
several turns whose history the runner carries (it needs the server's answers); trace replay is
in ``trace.py``. Everything draws from one seeded generator, so a seed fixes every prompt.
Single-request prompts leave room for the tokens the server adds (``overhead_tokens``: BOS, a
chat template), so the server sees exactly the requested length when the counter is exact.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from loadtest.config import (
    LongShortMixWorkloadConfig,
    MultiTurnWorkloadConfig,
    RandomWorkloadConfig,
    SharedPrefixWorkloadConfig,
    TraceWorkloadConfig,
)
from loadtest.lengths import sample_length
from loadtest.text import TextSynthesizer
from loadtest.trace import trace_sessions
from loadtest.types import Session, Turn

WorkloadConfig = (
    RandomWorkloadConfig
    | SharedPrefixWorkloadConfig
    | MultiTurnWorkloadConfig
    | TraceWorkloadConfig
    | LongShortMixWorkloadConfig
)


def random_sessions(
    cfg: RandomWorkloadConfig, synth: TextSynthesizer, rng: np.random.Generator
) -> Iterator[Session]:
    """vLLM's random dataset: one shared prefix (possibly empty) plus random text per prompt."""
    prefix = synth.draw_units(cfg.prefix_len_tokens, rng)
    for session_id in itertools.count():
        input_tokens = _fresh_tokens(sample_length(cfg.input_len, rng), synth)
        output_tokens = sample_length(cfg.output_len, rng)
        units = prefix + synth.draw_units(input_tokens, rng)
        text, tokens = synth.finish(units, cfg.prefix_len_tokens + input_tokens)
        yield Session(session_id=session_id, turns=(Turn(text, tokens, output_tokens),))


def _fresh_tokens(requested: int, synth: TextSynthesizer) -> int:
    """Tokens of new text for a prompt of ``requested`` tokens on the server (at least 1)."""
    return max(1, requested - synth.overhead_tokens)


def long_short_sessions(
    cfg: LongShortMixWorkloadConfig, synth: TextSynthesizer, rng: np.random.Generator
) -> Iterator[Session]:
    """Short requests with long ones spread evenly among them, each labelled by its class."""
    for session_id in itertools.count():
        is_long = int((session_id + 1) * cfg.long_fraction) > int(session_id * cfg.long_fraction)
        input_len = cfg.long_input_len if is_long else cfg.short_input_len
        output_len = cfg.long_output_len if is_long else cfg.short_output_len
        input_tokens = _fresh_tokens(sample_length(input_len, rng), synth)
        output_tokens = sample_length(output_len, rng)
        text, tokens = synth.make(input_tokens, rng)
        yield Session(
            session_id=session_id,
            turns=(Turn(text, tokens, output_tokens),),
            label="long" if is_long else "short",
        )


def shared_prefix_sessions(
    cfg: SharedPrefixWorkloadConfig, synth: TextSynthesizer, rng: np.random.Generator
) -> Iterator[Session]:
    """Each prompt: one of ``num_groups`` fixed prefixes (picked at random) + a unique suffix."""
    prefixes = [synth.draw_units(cfg.prefix_len_tokens, rng) for _ in range(cfg.num_groups)]
    for session_id in itertools.count():
        group = int(rng.integers(0, cfg.num_groups))
        suffix_tokens = _fresh_tokens(sample_length(cfg.suffix_len, rng), synth)
        output_tokens = sample_length(cfg.output_len, rng)
        units = prefixes[group] + synth.draw_units(suffix_tokens, rng)
        text, tokens = synth.finish(units, cfg.prefix_len_tokens + suffix_tokens)
        yield Session(session_id=session_id, turns=(Turn(text, tokens, output_tokens),))


def _think_time_s(cfg: MultiTurnWorkloadConfig, rng: np.random.Generator) -> float:
    if cfg.think_time_distribution == "fixed" or cfg.think_time_s == 0.0:
        return cfg.think_time_s
    return float(rng.exponential(cfg.think_time_s))


def multi_turn_sessions(
    cfg: MultiTurnWorkloadConfig, synth: TextSynthesizer, rng: np.random.Generator
) -> Iterator[Session]:
    """Chats of ``num_turns`` turns; turn k>0 waits a think time after turn k-1's answer."""
    system_text, system_tokens = synth.make(cfg.system_prompt_len_tokens, rng)
    for session_id in itertools.count():
        turns = []
        for turn_index in range(cfg.num_turns):
            text, tokens = synth.make(sample_length(cfg.user_len, rng), rng)
            think_s = 0.0 if turn_index == 0 else _think_time_s(cfg, rng)
            turns.append(Turn(text, tokens, sample_length(cfg.output_len, rng), think_s))
        yield Session(
            session_id=session_id,
            turns=tuple(turns),
            system_text=system_text,
            system_tokens=system_tokens,
        )


def build_sessions(
    workload: WorkloadConfig, synth: TextSynthesizer, seed: int, base_dir: Path | None = None
) -> Iterator[Session]:
    """Sessions for ``workload``; ``base_dir`` resolves a relative trace path."""
    rng = np.random.default_rng(seed)
    if isinstance(workload, RandomWorkloadConfig):
        return random_sessions(workload, synth, rng)
    if isinstance(workload, SharedPrefixWorkloadConfig):
        return shared_prefix_sessions(workload, synth, rng)
    if isinstance(workload, MultiTurnWorkloadConfig):
        return multi_turn_sessions(workload, synth, rng)
    if isinstance(workload, LongShortMixWorkloadConfig):
        return long_short_sessions(workload, synth, rng)
    return trace_sessions(workload, synth, rng, base_dir)


def requests_per_session(workload: WorkloadConfig) -> int:
    """Requests one session sends (turns for multi-turn, else 1)."""
    return workload.num_turns if isinstance(workload, MultiTurnWorkloadConfig) else 1
