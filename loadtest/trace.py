"""Mooncake trace replay: JSONL lines of ``timestamp``, ``input_length``, ``output_length``,
``hash_ids``.

Each hash id stands for one block of ``block_size_tokens`` prompt tokens (512 in the published
Mooncake traces). The first time a hash id appears it gets fresh random text; every later prompt
naming it reuses that exact text, so prompts share text (and KV prefix blocks) exactly where
their hash ids match. A prompt takes ``min(block, remaining)`` tokens from each of its hash ids in
order (a partial last block is a prefix of that block's text); tokens beyond its hash ids are
fresh text. Arrival times are ``(timestamp - first timestamp)`` in the trace's unit times
``time_scale``; the runner starts each request at its time (and never earlier).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from core.errors import ConfigError
from loadtest.config import TraceWorkloadConfig
from loadtest.text import TextSynthesizer
from loadtest.types import Session, Turn


@dataclass(frozen=True)
class TraceEntry:
    """One validated trace line."""

    timestamp: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _parse_line(line: str, where: str) -> TraceEntry:
    try:
        raw = json.loads(line)
        entry = TraceEntry(
            timestamp=float(raw["timestamp"]),
            input_length=int(raw["input_length"]),
            output_length=int(raw["output_length"]),
            hash_ids=tuple(int(h) for h in raw.get("hash_ids", [])),
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{where}: not a Mooncake trace record: {e}", param="path") from e
    if entry.input_length < 1 or entry.output_length < 1:
        raise ConfigError(f"{where}: input_length and output_length must be >= 1", param="path")
    return entry


def read_trace(path: Path) -> list[TraceEntry]:
    """All records of a JSONL trace, in timestamp order (blank lines skipped)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"cannot read trace {path}: {e}", param="path") from e
    entries = [
        _parse_line(line, f"{path}:{number}")
        for number, line in enumerate(lines, start=1)
        if line.strip()
    ]
    if not entries:
        raise ConfigError(f"trace {path} has no records", param="path")
    return sorted(entries, key=lambda e: e.timestamp)


def trace_sessions(
    cfg: TraceWorkloadConfig,
    synth: TextSynthesizer,
    rng: np.random.Generator,
    base_dir: Path | None = None,
) -> Iterator[Session]:
    """One single-turn session per trace record, each pinned to its arrival time."""
    path = Path(cfg.path).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    entries = read_trace(path)
    unit_s = 1e-3 if cfg.timestamp_unit == "ms" else 1.0
    first = entries[0].timestamp
    blocks: dict[int, list[str]] = {}
    for session_id, entry in enumerate(entries):
        units: list[str] = []
        # leave room for what the server adds (BOS ...): the server sees input_length tokens
        input_tokens = max(1, entry.input_length - synth.overhead_tokens)
        remaining = input_tokens
        for hash_id in entry.hash_ids:
            if remaining <= 0:
                break
            if hash_id not in blocks:
                blocks[hash_id] = synth.draw_units(cfg.block_size_tokens, rng)
            take = min(cfg.block_size_tokens, remaining)
            units += synth.prefix_units(blocks[hash_id], take)
            remaining -= take
        units += synth.draw_units(remaining, rng)
        text, tokens = synth.finish(units, input_tokens)
        output = entry.output_length
        if cfg.max_output_tokens is not None:
            output = min(output, cfg.max_output_tokens)
        yield Session(
            session_id=session_id,
            turns=(Turn(text, tokens, output),),
            arrival_s=(entry.timestamp - first) * unit_s * cfg.time_scale,
        )
