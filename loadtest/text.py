"""Synthetic prompt text with an exact token count.

Text is a string of *units*, each a space plus a common English word (``" river"``). A unit is
kept only if its token cost is additive (``count(u * 3) == 3 * count(u)``), so the count of a
concatenation is the sum of its units' costs: exact for byte-level BPE (Llama-3, Qwen2) and
byte tokenizers alike. With an exact tokenizer every text is re-counted and patched with
one-token *filler* units if a tokenizer merges across units after all; the returned count is
always the counter's. Units join without separators, so any prefix of units is a prefix of the
text: prompts that share units share text exactly (what shared-prefix and trace replay rely on).
A counter that estimates in words (``tokens_per_count`` != 1, the calibrated mode) gets
``tokens / tokens_per_count`` words for a requested token count. ``overhead_tokens`` (the
counter's) is what the server adds to a prompt; workloads subtract it so that prompts are the
requested length on the server.
"""

from __future__ import annotations

import logging

import numpy as np

from loadtest.tokens import TokenCounter

logger = logging.getLogger(__name__)

_WORD_TEXT = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city name team minute idea kid body back parent "
    "face others level office door health person art war history party result change morning "
    "reason research girl guy moment air teacher force education foot boy age policy music "
    "market sense nation plan college interest death course someone field role effect river "
    "light voice wall paper table window tree road green blue red black white small large "
    "good new first last long great little own other old big high different early young "
    "important few public bad same able open close run walk talk read write sing play move "
    "live hold bring begin keep start show hear turn help call try ask need feel leave put "
)
_WORDS = tuple(_WORD_TEXT.split())
WORD_UNITS = tuple(f" {w}" for w in _WORDS)
"""Every unit prompts may draw from (a word with its leading space), each equally likely."""
_FILLER_CANDIDATES = (" a", " I", ".", ",", "a", " the", "x")
_MAX_PATCHES = 4


class TextSynthesizer:
    """Builds texts of a requested token count for one ``TokenCounter``."""

    def __init__(self, counter: TokenCounter) -> None:
        self._counter = counter
        self._scale = counter.tokens_per_count
        self.overhead_tokens = counter.overhead_tokens
        units = [(u, counter.count(u)) for u in WORD_UNITS]
        additive = [(u, c) for u, c in units if c >= 1 and counter.count(u * 3) == 3 * c]
        if not additive:
            logger.warning("tokenizer %s merges across words: counts may be off", counter.name)
            additive = [(u, c) for u, c in units if c >= 1]
        cheapest = min(c for _, c in additive)
        chosen = [(u, c) for u, c in additive if c == 1] if cheapest == 1 else additive
        self._units = [u for u, _ in chosen]
        self._costs = np.array([c for _, c in chosen], dtype=np.int64)
        self._filler = self._find_filler()
        self._unit_cost = {u: c for u, c in chosen} | {self._filler: 1}

    def _find_filler(self) -> str:
        probe = self._units[0]
        probe_cost = int(self._costs[0])
        count = self._counter.count
        for candidate in _FILLER_CANDIDATES:
            single = count(candidate) == 1 and count(candidate * 4) == 4
            if single and count(probe + candidate) == probe_cost + 1:
                return candidate
        return self._units[int(np.argmin(self._costs))]

    def _counts(self, num_tokens: int) -> int:
        """``num_tokens`` in the counter's units."""
        return num_tokens if self._scale == 1.0 else max(0, round(num_tokens / self._scale))

    def draw_units(self, num_tokens: int, rng: np.random.Generator) -> list[str]:
        """Random units whose costs sum to ``num_tokens`` (fillers top up the remainder)."""
        num_tokens = self._counts(num_tokens)
        if num_tokens <= 0:
            return []
        mean_cost = float(self._costs.mean())
        picked: list[int] = []
        total = 0
        while total < num_tokens - int(self._costs.max()):
            batch = rng.integers(0, len(self._units), size=int(num_tokens / mean_cost) + 8)
            cumulative = total + np.cumsum(self._costs[batch])
            take = int(np.searchsorted(cumulative, num_tokens, side="right"))
            picked.extend(batch[:take].tolist())
            if take == 0:
                break
            total = int(cumulative[take - 1])
        units = [self._units[i] for i in picked]
        return units + [self._filler] * (num_tokens - total)

    def prefix_units(self, units: list[str], num_tokens: int) -> list[str]:
        """The leading units of ``units`` costing ``num_tokens`` (topped up with fillers)."""
        num_tokens = self._counts(num_tokens)
        out: list[str] = []
        total = 0
        for unit in units:
            cost = self._unit_cost[unit]
            if total + cost > num_tokens:
                break
            out.append(unit)
            total += cost
        return out + [self._filler] * (num_tokens - total)

    def finish(self, units: list[str], num_tokens: int) -> tuple[str, int]:
        """Join ``units`` into text; with an exact counter, patch it to ``num_tokens`` tokens.

        Returns the text and its token count as the counter measures (or estimates) it.
        """
        text = "".join(units)
        actual = self._counter.count(text)
        if self._scale != 1.0:
            return text, round(actual * self._scale)
        for _ in range(_MAX_PATCHES):
            if actual == num_tokens or not self._counter.exact:
                break
            if actual < num_tokens:
                text += self._filler * (num_tokens - actual)
            else:
                keep = max(0, len(text) - (actual - num_tokens) * max(1, len(self._filler)))
                text = text[:keep]
            actual = self._counter.count(text)
        return text, actual

    def make(self, num_tokens: int, rng: np.random.Generator) -> tuple[str, int]:
        """A fresh random text of ``num_tokens`` tokens and its measured count."""
        return self.finish(self.draw_units(num_tokens, rng), num_tokens)
