"""N-gram prompt lookup: longest suffix first, first earlier occurrence, incremental index."""

from __future__ import annotations

import random
from collections.abc import Sequence

from core.config import SpeculativeConfig
from core.errors import ConfigError
from engine.spec_decode import NgramProposer, build_proposer


def _proposer(min_n: int = 1, max_n: int = 3) -> NgramProposer:
    config = SpeculativeConfig(
        method="ngram", num_speculative_tokens=4, prompt_lookup_min=min_n, prompt_lookup_max=max_n
    )
    return NgramProposer(config)


def _brute_force(tokens: Sequence[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The definition, scanned in full: longest n, first earlier occurrence."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = list(tokens[length - n :])
        for start in range(0, length - n):
            if list(tokens[start : start + n]) == suffix:
                return list(tokens[start + n : min(start + n + k, length)])
    return []


def test_drafts_what_followed_the_longest_suffix() -> None:
    proposer = _proposer()
    #         0  1  2  3  4  5  6  7  8
    tokens = [5, 6, 7, 8, 9, 1, 6, 7, 8]
    # suffix (6, 7, 8) occurred ending at 4: the tokens after it are 9, 1, 6, 7
    assert proposer.propose("a", tokens, 5, 4) == [9, 1, 6, 7]
    assert proposer.propose("a", tokens, 5, 2) == [9, 1]


def test_no_match_and_below_min_propose_nothing() -> None:
    proposer = _proposer(min_n=2)
    assert proposer.propose("a", [1, 2, 3, 4], 4, 3) == []
    assert proposer.propose("b", [1, 2, 1], 3, 3) == []  # only a 1-gram repeats
    assert proposer.propose("c", [7], 1, 3) == []


def test_incremental_growth_matches_the_definition() -> None:
    rng = random.Random(3)
    proposer = _proposer(min_n=1, max_n=4)
    tokens = [rng.randrange(6) for _ in range(5)]
    for _ in range(300):
        assert proposer.propose("r", tokens, 5, 3) == _brute_force(tokens, 1, 4, 3)
        tokens.extend(rng.randrange(6) for _ in range(rng.randrange(1, 3)))


def test_finish_forgets_and_a_shorter_sequence_restarts() -> None:
    proposer = _proposer()
    proposer.propose("a", [1, 2, 3, 1, 2], 5, 2)
    proposer.propose("a", [4, 4], 2, 2)  # shorter: a fresh index, no stale n-grams
    assert proposer.propose("a", [4, 4, 9], 3, 2) == []
    proposer.finish("a")
    proposer.finish("unknown")
    assert proposer.propose("a", [1, 2, 1], 3, 2) == [2, 1]


def test_the_registry_builds_ngram_and_refuses_a_missing_method_in_one_line() -> None:
    config = SpeculativeConfig(method="ngram", num_speculative_tokens=3)
    assert isinstance(build_proposer(config), NgramProposer)
    suffix = SpeculativeConfig(method="suffix", num_speculative_tokens=3)
    try:
        proposer = build_proposer(suffix)
    except ConfigError as e:  # a build without engine/spec_decode/suffix.py
        assert "not available in this build" in e.message
    else:
        assert proposer.propose("r", [1, 2, 3, 1, 2], 5, 2) is not None
        proposer.finish("r")
