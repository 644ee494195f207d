"""The suffix proposer drafts what a request's own text or an earlier answer makes likely, grows
its trees with each step's new tokens, restarts a preempted request cleanly, and keeps only
``max_cached_requests`` finished outputs."""

from __future__ import annotations

import pytest

from core.errors import ConfigError
from engine.spec_decode.proposer import Proposer
from engine.spec_decode.suffix import SuffixProposer


def make_proposer(
    max_tree_depth: int = 24,
    max_cached_requests: int = 16,
    max_spec_factor: float = 2.0,
    min_token_prob: float = 0.1,
) -> SuffixProposer:
    return SuffixProposer(
        max_tree_depth=max_tree_depth,
        max_cached_requests=max_cached_requests,
        max_spec_factor=max_spec_factor,
        min_token_prob=min_token_prob,
    )


def replay(
    proposer: Proposer, request_id: str, prompt: list[int], output: list[int], k: int
) -> list[int]:
    """Decode ``output`` after ``prompt`` step by step, accepting drafted tokens as a greedy
    verifier would; the number of tokens each step emitted."""
    emitted: list[int] = []
    tokens = list(prompt)
    while len(tokens) < len(prompt) + len(output):
        done = len(tokens) - len(prompt)
        draft = proposer.propose(request_id, tokens, len(prompt), min(k, len(output) - done - 1))
        accepted = 0
        while accepted < len(draft) and draft[accepted] == output[done + accepted]:
            accepted += 1
        tokens.extend(output[done : done + accepted + 1])
        emitted.append(accepted + 1)
    proposer.finish(request_id)
    return emitted


def test_it_is_a_proposer() -> None:
    proposer: Proposer = make_proposer()
    assert proposer.propose("r", [1, 2, 3], 3, 4) == []


def test_a_repeated_list_is_drafted_from_the_request_itself() -> None:
    items = list(range(100, 140))
    proposer = make_proposer()
    # The prompt holds the list once; the answer repeats it.
    assert proposer.propose("r", [*items, 7, *items[:4]], len(items) + 1, 8) == items[4:12]
    emitted = replay(make_proposer(), "r", [*items, 7], items, k=8)
    assert sum(emitted) == len(items)
    assert len(emitted) <= 8  # about 40 tokens / (1 + 8) per step, after the first steps


def test_edited_code_drafts_the_unchanged_lines_again() -> None:
    code = [ord(c) for c in "def area(r):\n    return 3.14 * r * r\n\nprint(area(2))\n"]
    edited = [ord(c) for c in "def area(r):\n    return 3.14159 * r * r\n\nprint(area(2))\n"]
    emitted = replay(make_proposer(), "r", [*code, 0], edited, k=8)
    assert sum(emitted) == len(edited)
    assert len(emitted) < len(edited) / 3


def test_the_cache_drafts_an_answer_another_request_gave() -> None:
    answer = list(range(500, 530))
    proposer = make_proposer()
    replay(proposer, "first", [1, 2, 3], answer, k=8)
    assert proposer.num_cached_requests == 1
    # A new request whose prompt never saw the answer gets it from the cache.
    assert proposer.propose("second", [4, 5, *answer[:3]], 2, 6) == answer[3:9]
    emitted = replay(proposer, "third", [9, 9, 9], answer, k=8)
    assert len(emitted) <= 6


def test_the_draft_comes_from_the_tree_that_expects_more_accepted_tokens() -> None:
    # The prompt saw "500 501 502" followed by 900 once and by 901 once: a coin toss.
    prompt = [500, 501, 502, 900, 7, 500, 501, 502, 901, 8, 1, 500, 501, 502]
    alone = make_proposer()
    assert alone.propose("r", prompt, len(prompt), 8)[0] == 900
    # An earlier answer continued "500 501 502" one way only: the cache's draft is surer.
    proposer = make_proposer()
    replay(proposer, "earlier", [3], list(range(500, 530)), k=8)
    assert proposer.propose("r", prompt, len(prompt), 8) == list(range(503, 509))


def test_a_request_id_seen_again_after_finish_starts_from_nothing() -> None:
    proposer = make_proposer(max_cached_requests=0)
    proposer.propose("r", [1, 2, 3, 1, 2], 5, 4)
    proposer.finish("r")
    assert proposer.propose("r", [1, 2], 2, 4) == []


def test_max_spec_factor_scales_the_draft_with_the_match() -> None:
    tokens = [*range(10, 30), 1, 10, 11]  # the tail matches 2 tokens of the list
    assert make_proposer(max_spec_factor=1.0).propose("r", tokens, len(tokens), 16) == [12, 13]
    assert make_proposer(max_spec_factor=3.0).propose("r", tokens, len(tokens), 16) == [
        12,
        13,
        14,
        15,
        16,
        17,
    ]


def test_max_num_tokens_and_depth_bound_the_draft() -> None:
    tokens = [*range(10, 50), 1, 10, 11, 12, 13]
    assert make_proposer(max_spec_factor=8.0).propose("r", tokens, len(tokens), 3) == [14, 15, 16]
    shallow = make_proposer(max_tree_depth=6, max_spec_factor=8.0)
    draft = shallow.propose("r", tokens, len(tokens), 16)
    assert draft == [14, 15, 16, 17, 18]  # a 1-token match leaves 5 of depth 6 to draft


def test_min_token_prob_drops_unlikely_guesses() -> None:
    # After "1 2" came 3, 4 and 5 once each: each guess has probability 1/3 (a tie goes to the
    # smaller id), and what follows "1 2 3" is certain, so the path stays at 1/3.
    tokens = [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2]
    assert make_proposer(min_token_prob=0.3).propose("r", tokens, len(tokens), 4) == [3, 1, 2, 4]
    assert make_proposer(min_token_prob=0.5).propose("r", tokens, len(tokens), 4) == []


def test_each_step_grows_the_tree_by_the_new_tokens_only() -> None:
    proposer = make_proposer()
    prompt = [5, 6, 7, 8, 9]
    tokens = list(prompt)
    for token_id in [5, 6, 7]:
        tokens.append(token_id)
        proposer.propose("r", tokens, len(prompt), 4)
    tokens.extend([8, 9, 5])  # three accepted tokens in one step
    assert proposer.propose("r", tokens, len(prompt), 4) == [6, 7, 8, 9]


def test_a_preempted_request_restarts_from_its_prompt() -> None:
    proposer = make_proposer(max_cached_requests=0)
    prompt = [1, 2, 3, 4]
    proposer.propose("r", [*prompt, 9, 8, 1, 2], len(prompt), 4)
    # Preempted: the tokens shrink back to the prompt. What the first attempt generated is
    # gone ("4" was followed by "9 8" only there), and the request grows again from the prompt.
    assert proposer.propose("r", prompt, len(prompt), 4) == []
    assert proposer.propose("r", [*prompt, 1, 2], len(prompt), 4) == [3, 4, 1, 2]


def test_a_changed_token_at_the_same_length_counts_as_a_restart() -> None:
    proposer = make_proposer(max_cached_requests=0)
    proposer.propose("r", [1, 2, 3, 4, 5], 3, 4)
    assert proposer.propose("r", [1, 2, 3, 1, 2], 3, 4) == [3, 1, 2]  # not 3, 4, 5


def test_finish_is_idempotent_and_unknown_ids_are_fine() -> None:
    proposer = make_proposer()
    proposer.finish("never-seen")
    proposer.propose("r", [1, 2, 3, 4], 2, 4)
    proposer.finish("r")
    proposer.finish("r")
    assert proposer.num_cached_requests == 1
    assert proposer.num_running_requests == 0


def test_the_cache_keeps_only_the_newest_outputs() -> None:
    proposer = make_proposer(max_cached_requests=2)
    answers = {name: [base + i for i in range(12)] for name, base in (("a", 100), ("b", 200))}
    answers["c"] = [300 + i for i in range(12)]
    for name, answer in answers.items():
        proposer.propose(name, [0, *answer], 1, 4)
        proposer.finish(name)
    assert proposer.num_cached_requests == 2
    assert proposer.propose("probe-a", [7, 100, 101], 3, 4) == []  # the oldest was evicted
    assert proposer.propose("probe-c", [7, 300, 301], 3, 4) == [302, 303, 304, 305]


def test_memory_stays_bounded_over_many_requests() -> None:
    proposer = make_proposer(max_tree_depth=8, max_cached_requests=4)
    sizes = []
    for index in range(200):
        answer = [(index * 7 + i * 13) % 997 for i in range(40)]
        proposer.propose(f"r{index}", [1, 2, *answer], 2, 4)
        proposer.finish(f"r{index}")
        sizes.append(proposer.cache_tree.num_nodes())
        proposer.cache_tree.check_integrity()
    assert proposer.num_running_requests == 0
    assert proposer.num_cached_requests == 4
    # Four 40-token outputs: at most one leaf and one branch node per suffix.
    assert max(sizes) <= 4 * 40 * 2


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("max_tree_depth", {"max_tree_depth": 1}),
        ("max_cached_requests", {"max_cached_requests": -1}),
        ("max_spec_factor", {"max_spec_factor": 0.0}),
        ("min_token_prob", {"min_token_prob": 1.5}),
    ],
)
def test_bad_arguments_are_refused_naming_the_field(field: str, kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match=field):
        make_proposer(**kwargs)  # type: ignore[arg-type]
