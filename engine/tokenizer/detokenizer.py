"""Incremental detokenization for streaming: token ids in, new text out.

Decoding each token on its own is wrong: a multi-byte UTF-8 character may span several tokens, and
some decoders (SentencePiece's ``▁``) render a token differently at the start of a text. So each
step decodes a short window of ids — from ``prefix_offset`` (one settled chunk kept as context)
to the end — and emits what lies beyond the context once the window's text no longer ends in
U+FFFD (which may be an incomplete character the next token completes). The window then moves
forward, so a step costs O(window), not O(output).

A run of genuinely invalid bytes keeps the text ending in U+FFFD. With byte-level (lossy UTF-8)
decoding, after ``MAX_PENDING_TOKENS`` such tokens the window advances to the latest boundary
that is provably settled: at least three tokens before the end (an incomplete UTF-8 sequence is at
most three bytes, and every id kept in the window renders at least one byte) and splitting the
text cleanly there (decoding the two halves separately gives the same text). SentencePiece's
ByteFallback judges a whole run of byte tokens at once (one broken byte turns the run into
U+FFFDs), so there the window waits for the run to end — such runs are rare and short — and
text of a run already emitted while valid is not revised if a later byte breaks it.

Invariant: the concatenation of all deltas plus :meth:`finish` equals the decode of the context
and output ids, minus the decode of the context — exactly ``decode(output ids)`` without one —
and nothing emitted is ever revised.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.tokenizer.tokenizer import Tokenizer

REPLACEMENT_CHAR = "\ufffd"
# Tokens of prompt context used to render the first output tokens (leading-space decoders).
NUM_CONTEXT_TOKENS = 4
MAX_PENDING_TOKENS = 4
MAX_INCOMPLETE_UTF8_BYTES = 3


class IncrementalDetokenizer:
    """Turns one request's output token ids into text deltas as they are generated."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        skip_special_tokens: bool = True,
        prompt_token_ids: Sequence[int] = (),
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = list(prompt_token_ids[-NUM_CONTEXT_TOKENS:])
        context = self._decode(0, len(self._ids))
        if context.endswith(REPLACEMENT_CHAR):
            # NOTE: a context ending mid-character has no clean boundary; go without it.
            self._ids, context = [], ""
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._num_context_chars = len(context)  # chars of decode(ids[prefix:read]), all emitted

    @property
    def num_window_tokens(self) -> int:
        """Tokens in the decode window (bounded; for tests and metrics)."""
        return len(self._ids) - self._prefix_offset

    def step(self, token_ids: Sequence[int]) -> str:
        """Append ``token_ids`` (one or a few) and return the newly settled text (may be "")."""
        self._ids.extend(t for t in token_ids if not self._renders_empty(t))
        end = len(self._ids)
        text = self._decode(self._prefix_offset, end)
        if not text.endswith(REPLACEMENT_CHAR):
            return self._settle(end, text)
        if end - self._read_offset > MAX_PENDING_TOKENS and not self._tokenizer.byte_fallback:
            for boundary in range(end - MAX_INCOMPLETE_UTF8_BYTES, self._read_offset, -1):
                head = self._decode(self._prefix_offset, boundary)
                if head + self._decode(boundary, end) == text:
                    return self._settle(boundary, head)
        return ""

    def finish(self) -> str:
        """The text still held back; call once when the request ends."""
        end = len(self._ids)
        return self._settle(end, self._decode(self._prefix_offset, end))

    def _settle(self, boundary: int, head: str) -> str:
        """Emit ``head`` (the window's text up to clean ``boundary``) past the context; advance.

        The new window starts at the old read offset, so the settled chunk becomes the context.
        """
        delta = head[self._num_context_chars :]
        del self._ids[: self._read_offset]  # ids before the new window are never decoded again
        self._prefix_offset, self._read_offset = 0, boundary - self._read_offset
        self._num_context_chars = len(self._decode(0, self._read_offset))
        return delta

    def _renders_empty(self, token_id: int) -> bool:
        """Ids that decode to nothing (skipped special tokens, ids outside the vocabulary).

        NOTE: keeping them out of the window keeps it short (and boundaries checkable) while a
        model emits a run of them; decoding skips them anyway.
        """
        if self._skip_special_tokens and token_id in self._tokenizer.special_token_ids:
            return True
        return token_id < 0 or self._tokenizer.id_to_token(token_id) is None

    def _decode(self, start: int, end: int) -> str:
        if start >= end:
            return ""
        return self._tokenizer.decode(
            self._ids[start:end], skip_special_tokens=self._skip_special_tokens
        )
