"""A depth-bounded suffix tree over token sequences, with occurrence counts, for suffix decoding.

The tree holds every substring of at most ``max_depth`` tokens of the sequences added to it;
each node counts how many positions of those sequences start that substring. Edges are
path-compressed: a node covers a run of tokens stored as a reference into a sequence (no copy),
and every token of a run has the node's count, so memory grows with the number of branch points
rather than with ``tokens x depth``.

Sequences grow token by token (``extend``): the tree keeps, per sequence, where each of its
still-growing suffixes (the last ``max_depth - 1`` start positions) ends, so one new token costs
at most ``max_depth`` constant-time steps whatever the sequence's length. A whole sequence can be
removed again (``remove``), which is how the proposer's cache of finished outputs evicts.

``draft`` answers the proposer's question: the continuation most often seen after the tail of a
context, scored by its expected number of accepted tokens. Each node keeps its most often seen
child and its children's total count, so a draft costs its match plus its own length, never a
scan of the siblings.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass

from core.errors import ConfigError


class _Node:
    """A run of ``length`` tokens, ``ref[pos:pos + length]``, every one seen ``count`` times,
    with the bookkeeping of its children that a draft reads in constant time."""

    __slots__ = ("best", "children", "count", "length", "num_continuing", "pos", "ref")

    def __init__(self, ref: list[int], pos: int, length: int, count: int) -> None:
        self.ref = ref
        self.pos = pos
        self.length = length
        self.count = count
        self.children: dict[int, _Node] = {}
        self.num_continuing = 0  # the children's counts summed: occurrences that go on
        self.best: _Node | None = None  # the child seen most often

    def token(self, offset: int) -> int:
        return self.ref[self.pos + offset]

    def rank(self) -> tuple[int, int]:
        """Orders siblings: more often seen first, then (a tie) the smaller token id, so a draft
        depends only on the counts, never on the order the tree learned them in."""
        return self.count, -self.ref[self.pos]

    def note_gain(self, child: _Node) -> None:
        """``child`` (new, or counted once more) gained one occurrence."""
        self.num_continuing += 1
        if self.best is None or child.rank() > self.best.rank():
            self.best = child

    def note_loss(self, token_id: int, child: _Node) -> None:
        """``child`` lost one occurrence (and goes when it has none left)."""
        self.num_continuing -= 1
        if child.count == 0:
            del self.children[token_id]
        if self.best is child:
            self.best = max(self.children.values(), key=_Node.rank, default=None)


@dataclass
class _Sequence:
    """One added sequence: its tokens and the nodes where its still-growing suffixes end."""

    token_ids: list[int]
    sealed: bool
    # NOTE: suffix ends always sit at the end of a node's run (a split keeps the node object as
    # the lower half), so a node is a stable cursor for the suffix that ends there.
    open_suffix_ends: deque[_Node]


@dataclass(frozen=True)
class Draft:
    """A proposed continuation: its tokens, the expected number of them the target accepts
    (the sum of each prefix's estimated probability) and how many context tokens matched."""

    token_ids: tuple[int, ...]
    score: float
    match_length: int


NO_DRAFT = Draft(token_ids=(), score=0.0, match_length=0)


class SuffixTree:
    """Every substring of at most ``max_depth`` tokens of its sequences, counted."""

    def __init__(self, max_depth: int) -> None:
        if max_depth < 2:
            raise ConfigError(f"suffix tree max_depth must be at least 2, got {max_depth}")
        self.max_depth = max_depth
        self._root = _Node(ref=[], pos=0, length=0, count=0)
        self._sequences: dict[Hashable, _Sequence] = {}

    def num_tokens(self, seq_id: Hashable) -> int:
        """How many tokens of ``seq_id`` the tree holds (0 for an unknown id)."""
        seq = self._sequences.get(seq_id)
        return 0 if seq is None else len(seq.token_ids)

    def token_ids(self, seq_id: Hashable) -> Sequence[int]:
        """The tokens of ``seq_id`` the tree holds (read-only view; empty for an unknown id)."""
        seq = self._sequences.get(seq_id)
        return () if seq is None else seq.token_ids

    def extend(self, seq_id: Hashable, token_ids: Sequence[int]) -> None:
        """Append ``token_ids`` to sequence ``seq_id`` (a new one when unknown)."""
        seq = self._sequences.get(seq_id)
        if seq is None:
            seq = _Sequence(token_ids=[], sealed=False, open_suffix_ends=deque())
            self._sequences[seq_id] = seq
        if seq.sealed:
            raise ValueError(f"suffix tree sequence {seq_id!r} is sealed and cannot grow")
        for token_id in token_ids:
            self._append(seq, token_id)

    def seal(self, seq_id: Hashable) -> None:
        """``seq_id`` will not grow again: drop what growing it needs (its tokens stay)."""
        seq = self._sequences.get(seq_id)
        if seq is not None:
            seq.sealed = True
            seq.open_suffix_ends.clear()

    def remove(self, seq_id: Hashable) -> None:
        """Take every substring of ``seq_id`` back out of the counts. Unknown ids are fine."""
        seq = self._sequences.pop(seq_id, None)
        if seq is None:
            return
        token_ids = seq.token_ids
        for start in range(len(token_ids)):
            self._remove_suffix(token_ids, start, min(self.max_depth, len(token_ids) - start))

    def _append(self, seq: _Sequence, token_id: int) -> None:
        position = len(seq.token_ids)
        seq.token_ids.append(token_id)
        ends = seq.open_suffix_ends
        ends.append(self._root)  # the suffix starting at ``position`` opens with no tokens
        for _ in range(len(ends)):
            ends.append(self._grow(seq.token_ids, ends.popleft(), token_id, position))
        if len(ends) == self.max_depth:
            ends.popleft()  # the oldest suffix reached max_depth tokens and stops growing

    def _grow(self, token_ids: list[int], end: _Node, token_id: int, position: int) -> _Node:
        """The suffix ending at ``end`` gains ``token_id`` (at ``position``); its new end."""
        if (
            end.count == 1
            and end is not self._root
            and not end.children
            and end.ref is token_ids
            and end.pos + end.length == position
        ):
            end.length += 1  # a run only this suffix passes through: lengthen it in place
            return end
        child = end.children.get(token_id)
        if child is None:
            child = _Node(ref=token_ids, pos=position, length=1, count=1)
            end.children[token_id] = child
        elif child.length == 1:
            child.count += 1
        else:
            # The suffix takes the first token of a longer run: split it there. The lower part
            # keeps the node object, so the suffixes ending at its end keep their cursor.
            head = _Node(ref=child.ref, pos=child.pos, length=1, count=child.count + 1)
            child.pos += 1
            child.length -= 1
            head.children[child.token(0)] = child
            head.num_continuing = child.count
            head.best = child
            end.children[token_id] = head
            if end.best is child:
                end.best = head
            child = head
        end.note_gain(child)
        return child

    def _remove_suffix(self, token_ids: list[int], start: int, length: int) -> None:
        node = self._root
        depth = 0
        while depth < length:
            token_id = token_ids[start + depth]
            child = node.children[token_id]
            child.count -= 1
            node.note_loss(token_id, child)
            if child.count == 0:
                return  # only this suffix passed: its whole subtree went with it
            if child.ref is token_ids:
                # Others still pass through a run stored in the departing sequence: keep a copy.
                child.ref = token_ids[child.pos : child.pos + child.length]
                child.pos = 0
            depth += child.length
            node = child

    def _locate(self, pattern: Sequence[int]) -> tuple[_Node, int] | None:
        """Where ``pattern`` ends in the tree: a node and how many of its run's tokens it
        covers; None when the pattern is not a substring of the sequences."""
        node = self._root
        offset = 0
        for token_id in pattern:
            if offset == node.length:
                child = node.children.get(token_id)
                if child is None:
                    return None
                node, offset = child, 1
            elif node.ref[node.pos + offset] == token_id:
                offset += 1
            else:
                return None
        return node, offset

    def longest_match(self, context: Sequence[int]) -> int:
        """The length of the longest tail of ``context`` (under ``max_depth``) that the tree
        has seen followed by something (0: none)."""
        # NOTE: such tails form the lengths 1..m (a tail's own tails are followed by the same
        # token wherever it is), so a binary search finds m in O(depth log depth).
        low, high = 0, min(len(context), self.max_depth - 1)
        while low < high:
            middle = (low + high + 1) // 2
            if self._locate_continued(context[len(context) - middle :]) is None:
                high = middle - 1
            else:
                low = middle
        return low

    def _locate_continued(self, pattern: Sequence[int]) -> tuple[_Node, int] | None:
        """``_locate``, but None also when nothing ever followed the pattern."""
        found = self._locate(pattern)
        if found is None:
            return None
        node, offset = found
        return found if offset < node.length or node.children else None

    def draft(
        self,
        context: Sequence[int],
        max_num_tokens: int,
        max_spec_factor: float,
        min_token_prob: float,
    ) -> Draft:
        """The best-scoring continuation of a tail of ``context``, over every matching tail
        length; at most ``max_num_tokens``, ``max_spec_factor`` x the match's length and what
        the depth leaves after the match; it stops where the path's estimated probability
        falls under ``min_token_prob``."""
        limits = {
            match_length: min(
                max_num_tokens,
                int(max_spec_factor * match_length),
                self.max_depth - match_length,
            )
            for match_length in range(1, self.longest_match(context) + 1)
        }
        best = NO_DRAFT
        # The longest allowed drafts first (longer matches first among equals), so a confident
        # draft lets every later candidate be skipped unread.
        for match_length in sorted(limits, key=lambda m: (limits[m], m), reverse=True):
            limit = limits[match_length]
            if limit <= best.score:
                break  # even certain tokens could not beat the best draft so far
            found = self._locate_continued(context[len(context) - match_length :])
            assert found is not None  # every tail no longer than the longest match is followed
            candidate = self._follow(*found, limit, min_token_prob, match_length)
            if candidate.score > best.score:
                best = candidate
        return best

    def _follow(
        self, node: _Node, offset: int, limit: int, min_token_prob: float, match_length: int
    ) -> Draft:
        """Walk down from a match point taking the most frequent next token each time."""
        token_ids: list[int] = []
        prob = 1.0
        score = 0.0
        while len(token_ids) < limit:
            if offset < node.length:
                # Inside a run every occurrence continues the same way: the probability holds.
                take = min(node.length - offset, limit - len(token_ids))
                start = node.pos + offset
                token_ids.extend(node.ref[start : start + take])
                offset += take
                score += prob * take
                continue
            if not node.children:
                break
            child, share = _most_frequent_child(node)
            if prob * share < min_token_prob:
                break
            prob *= share
            node, offset = child, 0
        return Draft(token_ids=tuple(token_ids), score=score, match_length=match_length)

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` unless every node's counts and children agree: a child's
        key is its first token, children's counts sum to ``num_continuing`` and never exceed
        their parent's, ``best`` is the top-ranked child, and no run is empty or uncounted."""
        pending = [self._root]
        while pending:
            node = pending.pop()
            children = list(node.children.values())
            _require(
                all(key == child.token(0) for key, child in node.children.items()),
                "a child is filed under a token that is not its first",
            )
            _require(
                node.num_continuing == sum(child.count for child in children),
                "num_continuing is not the children's counts summed",
            )
            _require(
                node is self._root or node.num_continuing <= node.count,
                "children counted more often than their parent",
            )
            _require(
                node.best is max(children, key=_Node.rank, default=None),
                "best is not the most often seen child",
            )
            _require(
                all(child.count > 0 and child.length > 0 for child in children),
                "an empty or uncounted run",
            )
            pending.extend(children)

    def substring_counts(self) -> dict[tuple[int, ...], int]:
        """Every substring the tree holds with its count (for checks on small trees)."""
        counts: dict[tuple[int, ...], int] = {}
        for path, count in self._walk(self._root, ()):
            counts[path] = count
        return counts

    def _walk(self, node: _Node, prefix: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], int]]:
        for child in node.children.values():
            path = prefix
            for offset in range(child.length):
                path = (*path, child.token(offset))
                yield path, child.count
            yield from self._walk(child, path)

    def num_nodes(self) -> int:
        """How many nodes the tree holds (its memory, in nodes)."""
        pending = [self._root]
        num_nodes = 0
        while pending:
            node = pending.pop()
            num_nodes += 1
            pending.extend(node.children.values())
        return num_nodes - 1


def _most_frequent_child(node: _Node) -> tuple[_Node, float]:
    """The child most often seen next and its share of the occurrences that continue."""
    # NOTE: occurrences that end at ``node`` (at their sequence's end or at max_depth) say
    # nothing about what follows, so the share is among those that continue.
    best = node.best
    assert best is not None  # asked only of a node with children
    return best, best.count / node.num_continuing


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(f"suffix tree integrity: {message}")
