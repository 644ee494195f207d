"""Adaptive draft length: shrinks to what a request earns, grows back on full acceptance."""

from __future__ import annotations

from engine.spec_decode import DraftLengths


def test_length_follows_the_last_verification() -> None:
    lengths = DraftLengths(5, adaptive=True)
    assert lengths.next("a") == 5
    lengths.record("a", 5, 0)  # nothing accepted: draft one
    assert lengths.next("a") == 1
    lengths.record("a", 1, 1)  # all accepted: one more
    assert lengths.next("a") == 2
    lengths.record("a", 2, 2)
    lengths.record("a", 3, 3)
    lengths.record("a", 4, 4)
    lengths.record("a", 5, 5)
    assert lengths.next("a") == 5  # capped at num_speculative_tokens
    lengths.record("a", 5, 2)
    assert lengths.next("a") == 3
    assert lengths.next("b") == 5  # per request
    lengths.forget("a")
    assert lengths.next("a") == 5


def test_fixed_length_when_not_adaptive() -> None:
    lengths = DraftLengths(4, adaptive=False)
    lengths.record("a", 4, 0)
    assert lengths.next("a") == 4
