"""Stop strings over a stream of text deltas: detect them across token boundaries, never emit them.

Text is released only when no stop string can still begin in it: the longest suffix of the
unreleased text that is a prefix of some stop string is held back until the next delta decides
it. When a stop string completes, the text before it is released and the stream ends. The match
is the one that completes first (then the one starting earliest, i.e. the longest), which makes
the result independent of how the text was split into deltas. With ``include_stop`` (vLLM's
``include_stop_str_in_output``) the matched stop string ends the released text. Pure Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopCheck:
    """What one delta released: ``text`` to emit now, and the stop string it hit, if any."""

    text: str
    stop: str | None = None

    @property
    def stopped(self) -> bool:
        """True when a stop string was matched (``text`` is then the final piece)."""
        return self.stop is not None


class StopStringMatcher:
    """Filters one request's text deltas against its ``SamplingParams.stop`` strings."""

    def __init__(self, stops: Sequence[str], *, include_stop: bool = False) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self._include_stop = include_stop
        self._stops = tuple(dict.fromkeys(stops))
        self._max_hold_chars = max((len(s) for s in self._stops), default=1) - 1
        self._prefixes = frozenset(s[:n] for s in self._stops for n in range(1, len(s)))
        self._held = ""
        self._pieces: list[str] = []
        self._stop: str | None = None

    @property
    def stop(self) -> str | None:
        """The matched stop string (None while running or when ended without one)."""
        return self._stop

    @property
    def text(self) -> str:
        """All text released so far: the final, truncated text once the stream has ended."""
        return "".join(self._pieces)

    def feed(self, delta: str) -> StopCheck:
        """Add ``delta``; return what may be emitted now. After a stop, returns nothing."""
        if self._stop is not None:
            return StopCheck("", self._stop)
        buffer = self._held + delta
        match = self._first_completed_match(buffer)
        if match is not None:
            index, stop = match
            self._held, self._stop = "", stop
            end = index + len(stop) if self._include_stop else index
            return self._release(buffer[:end], stop)
        num_held = self._held_suffix_length(buffer)
        self._held = buffer[len(buffer) - num_held :]
        return self._release(buffer[: len(buffer) - num_held], None)

    def flush(self) -> str:
        """Release the held-back text when the stream ends without a stop string."""
        if self._stop is not None:
            return ""
        held, self._held = self._held, ""
        return self._release(held, None).text

    def _release(self, text: str, stop: str | None) -> StopCheck:
        if text:
            self._pieces.append(text)
        return StopCheck(text, stop)

    def _first_completed_match(self, buffer: str) -> tuple[int, str] | None:
        """(start, stop) of the match that ends first in ``buffer``; ties go to the longest."""
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self._stops:
            start = buffer.find(stop)
            if start < 0:
                continue
            candidate = (start + len(stop), start, stop)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
        return None if best is None else (best[1], best[2])

    def _held_suffix_length(self, buffer: str) -> int:
        """Length of the longest suffix of ``buffer`` that a stop string starts with."""
        for length in range(min(self._max_hold_chars, len(buffer)), 0, -1):
            if buffer[-length:] in self._prefixes:
                return length
        return 0
