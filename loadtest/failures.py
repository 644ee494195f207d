"""Why requests failed, grouped: ``2 × HTTP 400: this model's maximum context length is ...``.

Failures group by kind, HTTP status and message *shape*: runs of digits (and hex ids that hold
a digit) are the variable parts, so "the prompt has 9059 tokens" and "the prompt has 52430
tokens" fall into one group. A group's message keeps a value every member shares and shows a
value that varies as its range (``9059..52430``) or, for ids, as ``*``. Groups are ordered by
count, largest first; the summary JSON carries them as ``failure_reasons``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtest.types import FailureKind, RequestRecord

_VARIABLE = re.compile(r"\b[0-9A-Fa-f]*[0-9][0-9A-Fa-f]*(?:\.[0-9]+)?\b")
_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")
_MAX_MESSAGE_CHARS = 300


@dataclass
class _Group:
    kind: FailureKind
    http_status: int | None
    parts: tuple[str, ...]
    values: list[list[str]] = field(default_factory=list)
    count: int = 0

    def add(self, values: list[str]) -> None:
        if not self.values:
            self.values = [[v] for v in values]
        else:
            for slot, value in zip(self.values, values, strict=True):
                slot.append(value)
        self.count += 1

    def message(self) -> str:
        pieces = [self.parts[0]]
        for slot, text in zip(self.values, self.parts[1:], strict=True):
            pieces += [_merge(slot), text]
        return "".join(pieces)


def _merge(values: list[str]) -> str:
    """One value for a slot: shared, a numeric range, or ``*``."""
    distinct = set(values)
    if len(distinct) == 1:
        return values[0]
    if all(_NUMBER.fullmatch(v) for v in distinct):
        numbers = sorted(distinct, key=float)
        return f"{numbers[0]}..{numbers[-1]}"
    return "*"


def failure_reasons(records: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    """Failed requests grouped by kind, status and message shape, largest group first."""
    groups: dict[tuple[FailureKind, int | None, tuple[str, ...]], _Group] = {}
    for record in records:
        if record.success or record.failure_kind is None:
            continue
        message = record.error.strip() or "(no message)"
        parts = tuple(_VARIABLE.split(message))
        status = record.http_status if record.failure_kind is FailureKind.HTTP_STATUS else None
        key = (record.failure_kind, status, parts)
        group = groups.setdefault(key, _Group(record.failure_kind, status, parts))
        group.add(_VARIABLE.findall(message))
    ordered = sorted(groups.values(), key=lambda g: (-g.count, g.kind.value, g.parts))
    return [
        {
            "count": g.count,
            "kind": g.kind.value,
            "http_status": g.http_status,
            "message": g.message()[:_MAX_MESSAGE_CHARS],
        }
        for g in ordered
    ]


def reason_label(reason: dict[str, Any]) -> str:
    """``HTTP 400`` for a status failure, else the kind (``timeout``, ``sse_error`` ...)."""
    status = reason.get("http_status")
    return f"HTTP {status}" if status is not None else str(reason["kind"])


def reason_line(reason: dict[str, Any]) -> str:
    """``2 × HTTP 400: this model's maximum context length is 2048 tokens; ...``."""
    return f"{reason['count']} × {reason_label(reason)}: {reason['message']}"
