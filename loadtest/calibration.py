"""Token counts estimated from the server's reported usage, for servers without ``/tokenize``.

Prompts are drawn uniformly from a fixed vocabulary of word units (``text.WORD_UNITS``), so the
tokens a prompt costs per word average out to the vocabulary's own average. Before the run a few
probe requests (``max_tokens`` 1) measure exactly that: the vocabulary split into chunks that
fit the server's ``max_model_len``, each sent once, plus the first chunk sent twice over. With
``T(c)`` the reported ``usage.prompt_tokens`` of a probe, the server's per-prompt overhead is
``2 T(c0) - T(c0 c0)`` and the vocabulary costs ``sum T(ci) - k * overhead`` tokens, so
``tokens_per_word`` is that over the vocabulary's word count (exact for tokenizers whose counts
add up word by word: byte-level, and BPE vocabularies holding each word as a token). A prompt of
``n`` tokens then gets ``(n - overhead) / tokens_per_word`` words; what remains is the spread of
random word choice (about 1/sqrt(words) relative), which the run's summary measures on every
request that reports usage (``prompt_token_error_pct``).
"""

from __future__ import annotations

from dataclasses import dataclass

from loadtest.http_client import OpenAIStreamClient, Prompt, new_request_id
from loadtest.text import WORD_UNITS

_MAX_CHUNK_WORDS = 256
_TOKENS_PER_WORD_BOUND = 8
"""A generous bound (byte-level tokenizers spend ~6 tokens on a word) for sizing probes."""


@dataclass(frozen=True)
class Calibration:
    """The fitted estimate and how well it fits its probes."""

    tokens_per_word: float
    overhead_tokens: int
    num_probes: int
    fit_error_pct: float
    """Worst relative error of the estimate on the single-chunk probes, in percent (how much
    the vocabulary's chunks differ from its average)."""


class CalibratedCounter:
    """A ``TokenCounter`` counting words, each worth ``tokens_per_word`` tokens on the server."""

    exact = False
    mode = "calibrated"

    def __init__(self, calibration: Calibration) -> None:
        self.calibration = calibration
        self.tokens_per_count = calibration.tokens_per_word
        self.overhead_tokens = calibration.overhead_tokens
        self.name = f"{calibration.tokens_per_word:.3f} tokens/word fitted to the server's usage"

    def count(self, text: str) -> int:
        """Whitespace-separated words in ``text`` (tokens: times ``tokens_per_count``)."""
        return len(text.split())


def probe_chunks(max_model_len: int | None) -> list[tuple[str, ...]]:
    """The vocabulary in chunks whose doubled first chunk still fits ``max_model_len``."""
    cap = _MAX_CHUNK_WORDS
    if max_model_len is not None:
        cap = max(1, min(cap, (max_model_len - 1) // (2 * _TOKENS_PER_WORD_BOUND)))
    num_chunks = -(-len(WORD_UNITS) // cap)
    size = -(-len(WORD_UNITS) // num_chunks)
    return [WORD_UNITS[i : i + size] for i in range(0, len(WORD_UNITS), size)]


def fit(chunk_tokens: list[int], chunk_words: list[int], doubled_tokens: int) -> Calibration:
    """The estimate from each chunk's count and the first chunk's doubled count."""
    overhead = max(0, 2 * chunk_tokens[0] - doubled_tokens)
    vocabulary_tokens = sum(chunk_tokens) - len(chunk_tokens) * overhead
    tokens_per_word = vocabulary_tokens / sum(chunk_words)
    errors = [
        abs(tokens_per_word * words + overhead - tokens) / tokens
        for words, tokens in zip(chunk_words, chunk_tokens, strict=True)
    ]
    return Calibration(tokens_per_word, overhead, len(chunk_tokens) + 1, 100.0 * max(errors))


async def calibrate(client: OpenAIStreamClient, *, max_model_len: int | None) -> Calibration | None:
    """Send the probes and fit; None when a probe fails or the server reports no usage."""
    chunks = probe_chunks(max_model_len)
    texts = ["".join(chunk) for chunk in chunks] + ["".join(chunks[0]) * 2]
    counts: list[int] = []
    for text in texts:
        prompt: Prompt = [{"role": "user", "content": text}] if client.chat else text
        outcome = await client.stream(prompt, 1, new_request_id())
        if not outcome.success or not outcome.usage_prompt_tokens:
            return None
        counts.append(outcome.usage_prompt_tokens)
    calibration = fit(counts[:-1], [len(chunk) for chunk in chunks], counts[-1])
    return calibration if calibration.tokens_per_word > 0 else None
