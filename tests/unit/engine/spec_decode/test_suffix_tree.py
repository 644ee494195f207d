"""The suffix tree counts exactly the substrings (up to its depth) of what it holds, however the
sequences arrived (token by token or at once) and whatever was removed; drafts follow the most
frequent continuation and respect their bounds."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ConfigError
from engine.spec_decode.suffix_tree import SuffixTree


def substring_counts(
    sequences: Iterable[Sequence[int]], max_depth: int
) -> dict[tuple[int, ...], int]:
    """The reference: every substring of at most ``max_depth`` tokens, counted by brute force."""
    counts: dict[tuple[int, ...], int] = {}
    for tokens in sequences:
        for start in range(len(tokens)):
            for end in range(start + 1, min(start + max_depth, len(tokens)) + 1):
                key = tuple(tokens[start:end])
                counts[key] = counts.get(key, 0) + 1
    return counts


def built_at_once(sequences: dict[int, list[int]], max_depth: int) -> SuffixTree:
    tree = SuffixTree(max_depth)
    for seq_id, tokens in sequences.items():
        tree.extend(seq_id, tokens)
    return tree


# An operation: (sequence id, tokens to append) or (sequence id, None) to remove it.
operations = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.one_of(st.none(), st.lists(st.integers(0, 3), max_size=9)),
    ),
    max_size=14,
)


@settings(max_examples=200, deadline=None)
@given(max_depth=st.integers(2, 7), ops=operations, context=st.lists(st.integers(0, 3)))
def test_incremental_updates_equal_a_build_from_scratch(
    max_depth: int, ops: list[tuple[int, list[int] | None]], context: list[int]
) -> None:
    tree = SuffixTree(max_depth)
    held: dict[int, list[int]] = {}
    for seq_id, tokens in ops:
        if tokens is None:
            tree.remove(seq_id)
            held.pop(seq_id, None)
        else:
            tree.extend(seq_id, tokens)
            held.setdefault(seq_id, []).extend(tokens)
        assert tree.substring_counts() == substring_counts(held.values(), max_depth)
        tree.check_integrity()
    scratch = built_at_once(held, max_depth)
    assert tree.draft(context, 5, 2.0, 0.0) == scratch.draft(context, 5, 2.0, 0.0)
    for seq_id, tokens in held.items():
        assert list(tree.token_ids(seq_id)) == tokens


def test_removing_every_sequence_empties_the_tree() -> None:
    tree = SuffixTree(4)
    tree.extend("a", [1, 2, 3, 1, 2, 3, 4])
    tree.extend("b", [2, 3, 1, 2])
    tree.remove("a")
    tree.remove("a")  # unknown now: nothing happens
    assert tree.substring_counts() == substring_counts([[2, 3, 1, 2]], 4)
    tree.remove("b")
    assert tree.substring_counts() == {}
    assert tree.num_nodes() == 0


def test_a_run_shared_with_a_removed_sequence_still_reads_right() -> None:
    tree = SuffixTree(8)
    tree.extend("old", [5, 6, 7, 8, 9])
    tree.seal("old")
    tree.extend("new", [5, 6, 7, 8, 1])
    tree.remove("old")
    tree.extend("newer", [5, 6, 7, 8, 1])
    assert tree.substring_counts() == substring_counts([[5, 6, 7, 8, 1]] * 2, 8)
    assert tree.draft([5, 6], 3, 2.0, 0.0).token_ids == (7, 8, 1)


def test_a_sealed_sequence_cannot_grow() -> None:
    tree = SuffixTree(4)
    tree.extend("a", [1, 2, 3])
    tree.seal("a")
    with pytest.raises(ValueError, match="sealed"):
        tree.extend("a", [4])
    assert tree.substring_counts() == substring_counts([[1, 2, 3]], 4)


def test_the_draft_follows_the_most_frequent_continuation() -> None:
    tree = SuffixTree(8)
    for tokens in ([1, 2, 3], [1, 2, 3], [1, 2, 4]):
        tree.extend(object(), tokens)
    draft = tree.draft([9, 1, 2], 4, 4.0, 0.0)
    assert draft.token_ids == (3,)
    assert draft.match_length == 2
    assert draft.score == pytest.approx(2 / 3)


def test_depth_bounds_what_is_counted_and_what_is_drafted() -> None:
    tree = SuffixTree(4)
    tokens = list(range(10)) * 2
    tree.extend("a", tokens)
    assert max(len(key) for key in tree.substring_counts()) == 4
    draft = tree.draft(tokens[:12], 10, 10.0, 0.0)
    assert draft.match_length + len(draft.token_ids) <= 4
    assert draft.token_ids == tuple(tokens[12 : 12 + len(draft.token_ids)])


def test_max_spec_factor_and_max_num_tokens_bound_the_draft() -> None:
    tree = SuffixTree(32)
    tree.extend("a", list(range(20)))
    # The context's tail matches 2 tokens: a factor of 1.5 allows 3 of the 18 that follow.
    assert tree.draft([7, 0, 1], 16, 1.5, 0.0).token_ids == (2, 3, 4)
    assert tree.draft([7, 0, 1], 2, 8.0, 0.0).token_ids == (2, 3)
    assert tree.draft([7, 0, 1], 0, 8.0, 0.0).token_ids == ()


def test_min_token_prob_cuts_the_draft_where_the_path_gets_unlikely() -> None:
    tree = SuffixTree(8)
    # After [1, 2]: 3 four times in five, then after [1, 2, 3]: 5 or 6 evenly.
    for tail in ([3, 5], [3, 5], [3, 6], [3, 6], [4, 4]):
        tree.extend(object(), [1, 2, *tail])
    context = [1, 2]
    assert tree.draft(context, 8, 8.0, 0.0).token_ids == (3, 5)  # 0.8, then 0.4
    assert tree.draft(context, 8, 8.0, 0.5).token_ids == (3,)
    assert tree.draft(context, 8, 8.0, 0.9).token_ids == ()


def test_no_draft_when_the_tail_was_never_followed() -> None:
    tree = SuffixTree(8)
    tree.extend("a", [1, 2, 3, 4])
    assert tree.draft([1, 2, 3, 4], 4, 4.0, 0.0).token_ids == ()
    assert tree.draft([8, 9], 4, 4.0, 0.0).token_ids == ()
    assert tree.longest_match([1, 2, 3, 4]) == 0
    assert tree.longest_match([1, 2, 3]) == 3


def test_a_depth_under_two_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_depth"):
        SuffixTree(1)
