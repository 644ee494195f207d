"""Speculative decoding as one load-test run saw it: the server's ``pdserve:spec_decode_*``
counters read from ``/metrics`` before and after the run, as summary keys.

``spec_decode_acceptance_length`` is the mean tokens a verify row yielded (1 + accepted drafts
per draft), the number ``pdserve status`` shows per replica; the rate and the per-position rates
are of draft tokens. The counters are summed over every replica and pool the server reports, so
other traffic during the run counts too. A server that did not speculate (no counters, or no
draft verified during the run) adds no key.
"""

from __future__ import annotations

from typing import Any

from loadtest.fault_schedule import Counters

_PREFIX = "pdserve:spec_decode_"
_DRAFTS = f"{_PREFIX}num_drafts_total"
_DRAFT_TOKENS = f"{_PREFIX}num_draft_tokens_total"
_ACCEPTED = f"{_PREFIX}num_accepted_tokens_total"
_PER_POS = f"{_PREFIX}num_accepted_tokens_per_pos_total"


def spec_decode_summary(before: Counters, after: Counters) -> dict[str, Any]:
    """The run's speculative-decoding keys (empty when no draft was verified during it)."""
    drafts = _delta(before, after, _DRAFTS)
    if drafts <= 0:
        return {}
    draft_tokens = _delta(before, after, _DRAFT_TOKENS)
    accepted = _delta(before, after, _ACCEPTED)
    per_pos = _per_position(after)
    for position, count in _per_position(before).items():
        per_pos[position] = per_pos.get(position, 0.0) - count
    return {
        "spec_decode_acceptance_length": 1.0 + accepted / drafts,
        "spec_decode_acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
        "spec_decode_num_drafts": int(drafts),
        "spec_decode_num_draft_tokens": int(draft_tokens),
        "spec_decode_num_accepted_tokens": int(accepted),
        "spec_decode_per_position_acceptance_rates": [
            per_pos.get(position, 0.0) / drafts for position in range(max(per_pos, default=-1) + 1)
        ],
    }


def _delta(before: Counters, after: Counters, name: str) -> float:
    return _sum(after, name) - _sum(before, name)


def _sum(counters: Counters, name: str) -> float:
    """``name``'s samples summed over every label set."""
    return sum(value for key, value in counters.items() if key.partition("{")[0] == name)


def _per_position(counters: Counters) -> dict[int, float]:
    """Accepted drafts by position (label ``position``), summed over the other labels."""
    out: dict[int, float] = {}
    for key, value in counters.items():
        name, _, labels = key.partition("{")
        if name != _PER_POS:
            continue
        for label in labels.rstrip("}").split(","):
            label_name, _, label_value = label.partition("=")
            if label_name == "position":
                position = int(label_value.strip('"'))
                out[position] = out.get(position, 0.0) + value
    return out
