"""Incremental detokenizer: deltas concatenate to the full decode, never a premature U+FFFD."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from engine.tokenizer import IncrementalDetokenizer, Tokenizer

FFFD = "\ufffd"


def _stream(
    tokenizer: Tokenizer, ids: list[int], chunks: list[int], skip_special_tokens: bool = True
) -> tuple[list[str], int]:
    """Feed ``ids`` in ``chunks``; check the prefix property at every step; return deltas."""
    final = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    deltas: list[str] = []
    max_window, start = 0, 0
    for size in chunks:
        deltas.append(detok.step(ids[start : start + size]))
        start += size
        emitted = "".join(deltas)
        # Nothing emitted is ever revised: a premature U+FFFD would break this.
        assert final.startswith(emitted), (ids[:start], emitted, final)
        max_window = max(max_window, detok.num_window_tokens)
    deltas.append(detok.finish())
    assert "".join(deltas) == final
    return deltas, max_window


def _random_chunks(rng: random.Random, n: int) -> list[int]:
    chunks = []
    while n > 0:
        chunks.append(min(n, rng.choice([1, 1, 1, 2, 3])))
        n -= chunks[-1]
    return chunks


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_token_streams_match_full_decode(
    tokenizer: Tokenizer, skip_special_tokens: bool
) -> None:
    rng = random.Random(1234)
    text_bytes = "aé世🎉\u0301".encode()
    pools = [
        list(range(256)),  # any byte: mostly invalid UTF-8
        list(range(0x80, 0x100)),  # only non-ASCII bytes: lead/continuation soup
        list(range(320)),  # bytes and special tokens
        [*text_bytes, 0xFF, 300],  # valid characters, now and then broken
    ]
    worst_window = 0
    for trial in range(240):
        pool = pools[trial % len(pools)]
        ids = [rng.choice(pool) for _ in range(rng.randint(0, 64))]
        _, max_window = _stream(tokenizer, ids, _random_chunks(rng, len(ids)), skip_special_tokens)
        worst_window = max(worst_window, max_window)
    assert worst_window <= 12  # O(window) per step, whatever the stream


def test_multibyte_characters_are_emitted_when_complete(tokenizer: Tokenizer) -> None:
    text = "a🎉世e\u0301"
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas, _ = _stream(tokenizer, ids, [1] * len(ids))
    assert deltas == ["a", "", "", "", "🎉", "", "", "世", "e", "", "\u0301", ""]


def test_invalid_bytes_are_emitted_once_settled(tokenizer: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.step([0xFF]) == ""  # could be the start of something: held back
    assert detok.step([ord("a")]) == FFFD + "a"
    assert detok.step([0xE4, 0xB8]) == ""  # incomplete character
    assert detok.step([0xAD, 0xE4]) == ""  # completed, but the next one is pending
    assert detok.finish() == "中" + FFFD  # stream ended mid-character


def test_long_runs_keep_the_window_short(tokenizer: Tokenizer) -> None:
    runs = [
        [0x80] * 500,  # stray continuation bytes: every text ends in U+FFFD
        [0xE4, 0xB8] + [300] * 500 + [0xAD],  # special tokens inside a character
        list("世界".encode()) * 100,
    ]
    for ids in runs:
        _, max_window = _stream(tokenizer, ids, [1] * len(ids))
        assert max_window <= 12
    _, max_window = _stream(tokenizer, runs[1], [1] * len(runs[1]), skip_special_tokens=False)
    assert max_window <= 12


_BYTE_ID_OFFSET = 4


def _sentencepiece_like() -> Tokenizer:
    """A Llama-2-style tokenizer: ``▁`` word starts and ``<0xNN>`` byte fallback tokens."""
    vocab = {"<unk>": 0, "▁hello": 1, "▁world": 2, "!": 3}
    vocab.update({f"<0x{b:02X}>": _BYTE_ID_OFFSET + b for b in range(0x80, 0x100)})
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return Tokenizer(backend, {})


def test_byte_fallback_streams_match_full_decode() -> None:
    # ByteFallback renders each byte of a broken run as its own U+FFFD (lossy UTF-8 gives one
    # per maximal invalid subsequence), and judges a run of byte tokens as a whole. Streams are
    # what SentencePiece would produce: pieces for words, byte tokens for the bytes of
    # characters outside the vocabulary.
    tokenizer = _sentencepiece_like()
    rng = random.Random(99)
    units = [[1], [2], [3], *([_BYTE_ID_OFFSET + b for b in c.encode()] for c in "é世🎉\u0301")]
    for _ in range(200):
        ids = [t for _ in range(rng.randint(0, 24)) for t in rng.choice(units)]
        if rng.random() < 0.3:  # end mid-character, in a run of its own (see above)
            ids += [2, *rng.choice(units[3:])[:-1]]
        _, max_window = _stream(tokenizer, ids, _random_chunks(rng, len(ids)))
        assert max_window <= 24  # waits for whole characters, chunks may keep splitting them


def test_prompt_context_keeps_the_leading_space() -> None:
    tokenizer = _sentencepiece_like()
    assert tokenizer.decode([2]) == "world"  # a text's first word loses its space
    without_context = IncrementalDetokenizer(tokenizer)
    assert without_context.step([2]) == "world"
    with_context = IncrementalDetokenizer(tokenizer, prompt_token_ids=[1])
    zhong = [_BYTE_ID_OFFSET + b for b in "中".encode()]
    output_ids = [2, 3, 1, *zhong, 3]
    deltas = [with_context.step([t]) for t in output_ids]
    assert deltas == [" world", "!", " hello", "", "", "中", "!"]
    assert with_context.finish() == ""
    assert "".join(deltas) == tokenizer.decode([1, *output_ids])[len("hello") :]


def test_context_ending_mid_character_is_dropped(tokenizer: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tokenizer, prompt_token_ids=[ord("x"), 0xE4])
    assert detok.step([0xB8, 0xAD]) == ""
    assert detok.step([ord("y")]) == FFFD + FFFD + "y"  # decode of the output alone
    assert detok.finish() == ""


def test_byte_fallback_is_detected(tokenizer: Tokenizer) -> None:
    assert _sentencepiece_like().byte_fallback
    assert not tokenizer.byte_fallback
