"""The speculative-decoding workloads and the offline acceptance simulator: repetitive answers
reuse their prompts and chat answers do not; the simulator counts exactly what a greedy verifier
would accept, and ranks suffix decoding above no speculation where answers repeat."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from benchmarks.spec_acceptance import AcceptanceStats, compare_methods, simulate_acceptance
from benchmarks.spec_workloads import (
    WORKLOADS,
    TokenCase,
    Workload,
    byte_token_cases,
    text_cases,
    tokenized_cases,
)
from engine.spec_decode.proposer import Proposer
from engine.spec_decode.suffix import SuffixProposer


def ngrams(token_ids: Sequence[int], n: int) -> set[tuple[int, ...]]:
    return {tuple(token_ids[i : i + n]) for i in range(len(token_ids) - n + 1)}


def reused_share(case: TokenCase, n: int = 8) -> float:
    """The share of the reference's n-grams that its prompt already holds."""
    reference = ngrams(case.reference_token_ids, n)
    return len(reference & ngrams(case.prompt_token_ids, n)) / len(reference)


class NoDraft:
    """Never guesses: speculation off."""

    def propose(
        self, request_id: str, token_ids: Sequence[int], num_prompt_tokens: int, max_num_tokens: int
    ) -> list[int]:
        return []

    def finish(self, request_id: str) -> None:
        return None


class Oracle:
    """Guesses ``answer`` exactly (it knows the reference), but only ``max_num_tokens``."""

    def __init__(self, answer: Sequence[int], wrong_every: int = 0) -> None:
        self.answer = list(answer)
        self.wrong_every = wrong_every
        self.finished: list[str] = []

    def propose(
        self, request_id: str, token_ids: Sequence[int], num_prompt_tokens: int, max_num_tokens: int
    ) -> list[int]:
        done = len(token_ids) - num_prompt_tokens
        draft = self.answer[done : done + max_num_tokens]
        if self.wrong_every and len(draft) >= self.wrong_every:
            draft[self.wrong_every - 1] = -1  # the target never emits -1
        return draft

    def finish(self, request_id: str) -> None:
        self.finished.append(request_id)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_each_workload_has_distinct_non_empty_cases(workload: Workload) -> None:
    cases = text_cases(workload)
    assert len(cases) >= 5
    assert len({case.name for case in cases}) == len(cases)
    assert all(case.workload == workload and case.prompt and case.reference for case in cases)


def test_repetitive_answers_reuse_their_prompt_and_chat_answers_do_not() -> None:
    for case in byte_token_cases("repetitive"):
        assert reused_share(case) > 0.5, case.name
    for case in byte_token_cases("chat"):
        assert reused_share(case) < 0.1, case.name


def test_byte_cases_are_the_utf8_bytes_and_any_tokenizer_can_be_used() -> None:
    case = text_cases("chat")[0]
    tokens = byte_token_cases("chat")[0]
    assert bytes(tokens.prompt_token_ids).decode("utf-8") == case.prompt
    assert bytes(tokens.reference_token_ids).decode("utf-8") == case.reference
    words = tokenized_cases("chat", lambda text: [len(word) for word in text.split()])[0]
    assert words.prompt_token_ids == tuple(len(word) for word in case.prompt.split())


def test_without_drafts_every_step_emits_one_token() -> None:
    cases = byte_token_cases("chat")
    stats = simulate_acceptance(NoDraft(), cases, num_speculative_tokens=4)
    num_tokens = sum(len(case.reference_token_ids) for case in cases)
    assert stats == AcceptanceStats(
        num_steps=num_tokens,
        num_output_tokens=num_tokens,
        num_drafts=0,
        num_draft_tokens=0,
        num_accepted_tokens=0,
    )
    assert stats.mean_acceptance_length == 1.0


def test_a_perfect_guess_emits_k_plus_one_tokens_a_step() -> None:
    case = TokenCase(name="c", prompt_token_ids=(1, 2), reference_token_ids=tuple(range(10, 20)))
    oracle = Oracle(case.reference_token_ids)
    stats = simulate_acceptance(oracle, [case], num_speculative_tokens=3)
    # Steps emit 4, 4, then the last 2 (one drafted token: the step's own is the last).
    assert stats == AcceptanceStats(
        num_steps=3,
        num_output_tokens=10,
        num_drafts=3,
        num_draft_tokens=7,
        num_accepted_tokens=7,
    )
    assert stats.mean_acceptance_length == pytest.approx(1 + 7 / 3)
    assert oracle.finished == ["0-c"]


def test_a_wrong_token_ends_the_accepted_run() -> None:
    case = TokenCase(name="c", prompt_token_ids=(1,), reference_token_ids=tuple(range(10, 19)))
    stats = simulate_acceptance(Oracle(case.reference_token_ids, wrong_every=2), [case], 4)
    # Each step: the first drafted token is right, the second wrong, so 2 tokens a step.
    assert stats.num_accepted_tokens == 4
    assert stats.num_steps == 5
    assert stats.tokens_per_step == pytest.approx(9 / 5)


def test_suffix_decoding_beats_no_speculation_most_where_answers_repeat() -> None:
    methods: dict[str, Callable[[], Proposer]] = {
        "none": NoDraft,
        "suffix": lambda: SuffixProposer(
            max_tree_depth=24, max_cached_requests=64, max_spec_factor=1.0, min_token_prob=0.1
        ),
    }
    repetitive = compare_methods(methods, byte_token_cases("repetitive"), 8)
    chat = compare_methods(methods, byte_token_cases("chat"), 8)
    assert repetitive["none"].mean_acceptance_length == 1.0
    assert repetitive["suffix"].mean_acceptance_length > 3.0
    assert chat["suffix"].mean_acceptance_length < repetitive["suffix"].mean_acceptance_length


def test_a_bad_draft_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        simulate_acceptance(NoDraft(), byte_token_cases("chat"), 0)
