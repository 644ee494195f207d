"""Stop strings over streamed deltas: detected across boundaries, never emitted."""

from __future__ import annotations

import itertools
import random

import pytest

from engine.sampling import StopStringMatcher


def _run(stops: list[str], deltas: list[str]) -> tuple[list[str], str | None, str]:
    """Feed ``deltas`` until a stop; return the emitted pieces, the stop, the final text."""
    matcher = StopStringMatcher(stops)
    emitted = []
    for delta in deltas:
        check = matcher.feed(delta)
        emitted.append(check.text)
        if check.stopped:
            break
    else:
        emitted.append(matcher.flush())
    assert "".join(emitted) == matcher.text
    return emitted, matcher.stop, matcher.text


def test_no_stop_strings_passes_text_through() -> None:
    emitted, stop, text = _run([], ["Hel", "lo", " wor", "ld"])
    assert emitted == ["Hel", "lo", " wor", "ld", ""]
    assert stop is None and text == "Hello world"


def test_stop_split_across_three_tokens() -> None:
    emitted, stop, text = _run(["STOP"], ["Hello S", "T", "O", "P and more"])
    assert emitted == ["Hello ", "", "", ""]
    assert stop == "STOP" and text == "Hello "


def test_held_prefix_is_released_when_it_turns_out_not_to_stop() -> None:
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("abc S").text == "abc "
    assert matcher.feed("T").text == ""
    check = matcher.feed("X")
    assert check.text == "STX" and not check.stopped
    assert matcher.feed("STO").text == ""
    assert matcher.flush() == "STO"  # ended without a stop: held text is released
    assert matcher.text == "abc STXSTO" and matcher.stop is None


def test_stop_at_the_very_start() -> None:
    emitted, stop, text = _run(["<end>"], ["<end>", "never seen"])
    assert emitted == [""] and stop == "<end>" and text == ""
    emitted, stop, text = _run(["<end>"], ["<", "e", "nd>tail"])
    assert emitted == ["", "", ""] and stop == "<end>" and text == ""


def test_overlapping_candidates_first_completion_wins() -> None:
    # "bc" completes before "abcd" could.
    assert _run(["abcd", "bc"], ["xa", "b", "cd"])[1:] == ("bc", "xa")
    assert _run(["abcd", "bc"], ["xabcd"])[1:] == ("bc", "xa")  # same answer in one delta
    # Both end at the same character: the one starting earlier (longer) wins.
    assert _run(["c", "abc"], ["zab", "c"])[1:] == ("abc", "z")
    # A held prefix of one stop string contains another stop string.
    assert _run(["aab", "ab"], ["a", "a", "b"])[1:] == ("aab", "")
    assert _run(["xyz", "yq"], ["xy", "q"])[1:] == ("yq", "x")


def test_unicode_stop_strings() -> None:
    assert _run(["世界"], ["你好", "世", "界!"])[1:] == ("世界", "你好")
    assert _run(["🎉"], ["ok 🎉 done"])[1:] == ("🎉", "ok ")


def test_feed_after_stop_emits_nothing() -> None:
    matcher = StopStringMatcher(["."])
    assert matcher.feed("a.b").text == "a"
    again = matcher.feed("more")
    assert again.text == "" and again.stop == "."
    assert matcher.flush() == ""
    assert matcher.text == "a"


def test_empty_stop_string_is_rejected() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        StopStringMatcher(["ok", ""])


def _reference(stops: list[str], full: str) -> tuple[str, str | None]:
    """Character by character: the first position where some stop string ends."""
    for end in range(1, len(full) + 1):
        ended = [s for s in stops if full[:end].endswith(s)]
        if ended:
            stop = max(ended, key=len)
            return full[: end - len(stop)], stop
    return full, None


def test_random_splits_match_the_character_reference() -> None:
    rng = random.Random(7)
    for _ in range(400):
        alphabet = "abc世"
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(3)]
        full = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(full) + 1), k=min(len(full) + 1, rng.randint(0, 8))))
        bounds = [0, *cuts, len(full)]
        deltas = [full[a:b] for a, b in itertools.pairwise(bounds)]
        emitted, stop, text = _run(stops, deltas)
        assert (text, stop) == _reference(stops, full), (stops, deltas)
        for i in range(len(emitted)):  # nothing emitted may ever be part of a stop string
            assert "".join(emitted[: i + 1]) == full[: len("".join(emitted[: i + 1]))]
