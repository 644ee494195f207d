"""The rejection sampler: greedy keeps the argmax path, random keeps the target distribution.

The statistical tests draw tens of thousands of verifications over a six-token vocabulary with a
fixed seed and bound the total-variation distance between the emitted tokens' frequencies and
the target distribution; a sampler that redraws from the full distribution after a rejection
(the draft not removed) is off by more than ten times the bound.
"""

from __future__ import annotations

import pytest
import torch

from core.sampling import SamplingParams
from engine.sampling import DraftedRequest, RejectionSampler, Sampler, SamplingRow, rejection
from engine.sampling.ops import filtered_probs

VOCAB = 6
LOGITS = torch.tensor(
    [
        [1.0, 0.2, -0.5, 0.9, 0.0, -1.0],
        [0.1, 1.3, 0.3, -0.2, 0.8, 0.0],
        [-0.3, 0.0, 0.7, 0.4, 1.1, 0.2],
    ]
)
DRAFTS = (3, 4)  # plausible but not the argmax at either position


def _drafted(params: SamplingParams, n: int) -> list[DraftedRequest]:
    rows = tuple(SamplingRow(params=params) for _ in range(len(DRAFTS) + 1))
    return [DraftedRequest(DRAFTS, rows)] * n


def _target(params: SamplingParams, position: int) -> torch.Tensor:
    top_k = torch.tensor([params.top_k]) if params.top_k > 0 else None
    top_p = torch.tensor([params.top_p]) if params.top_p < 1.0 else None
    return filtered_probs(
        LOGITS[position : position + 1], torch.tensor([params.temperature]), top_k, top_p
    )[0]


def _frequencies(tokens: list[int]) -> torch.Tensor:
    counts = torch.bincount(torch.tensor(tokens), minlength=VOCAB).double()
    return counts / counts.sum()


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a.double() - b.double()).abs().sum())


def test_greedy_accepts_while_drafts_match_the_argmax() -> None:
    sampler = RejectionSampler(Sampler(seed=0))
    greedy = SamplingParams(temperature=0.0)
    rows = tuple(SamplingRow(params=greedy) for _ in range(3))
    argmaxes = LOGITS.argmax(dim=-1).tolist()  # [0, 1, 4]
    results = sampler.verify(
        torch.cat([LOGITS, LOGITS, LOGITS]),
        [
            DraftedRequest((argmaxes[0], argmaxes[1]), rows),  # all accepted: bonus at 2
            DraftedRequest((argmaxes[0], 5), rows),  # second rejected: argmax at 1
            DraftedRequest((2, argmaxes[1]), rows),  # first rejected
        ],
    )
    assert [r.token_ids for r in results] == [
        (argmaxes[0], argmaxes[1], argmaxes[2]),
        (argmaxes[0], argmaxes[1]),
        (argmaxes[0],),
    ]
    assert [r.num_accepted for r in results] == [2, 1, 0]
    assert all(r.finite for r in results)


def test_min_tokens_mask_counts_the_drafts_before_each_position() -> None:
    sampler = RejectionSampler(Sampler(seed=0))
    params = SamplingParams(temperature=0.0, min_tokens=2)
    eos = int(LOGITS[1].argmax())  # the argmax at position 1 is masked there (1 token out)
    rows = tuple(
        SamplingRow(params=params, num_generated_tokens=j, eos_token_ids=(eos,)) for j in range(3)
    )
    result = sampler.verify(LOGITS, [DraftedRequest((0, eos), rows)])[0]
    assert result.num_accepted == 1  # eos is banned at position 1 (one token generated)
    assert result.token_ids[1] != eos


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, seed=7),
        SamplingParams(temperature=0.7, top_k=4, top_p=0.9),
    ],
    ids=["plain", "top-k-top-p"],
)
def test_emitted_tokens_follow_the_target_distribution(params: SamplingParams) -> None:
    sampler = RejectionSampler(Sampler(seed=11))
    num = 40_000
    results = sampler.verify(LOGITS.repeat(num, 1), _drafted(params, num))
    first = [r.token_ids[0] for r in results]
    assert _tv(_frequencies(first), _target(params, 0)) < 0.015
    # given the first draft was accepted, the second token follows position 1's target
    second = [r.token_ids[1] for r in results if r.num_accepted >= 1]
    assert len(second) > 5_000
    assert _tv(_frequencies(second), _target(params, 1)) < 0.025
    # acceptance of the first draft happens with its target probability
    rate = sum(r.num_accepted >= 1 for r in results) / num
    assert abs(rate - float(_target(params, 0)[DRAFTS[0]])) < 0.015


def test_a_sampler_that_keeps_the_draft_after_rejecting_it_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bound is tight enough: redrawing from the full target after a rejection (the
    draft not removed, the classic bug) moves the draft token's frequency far past it."""
    monkeypatch.setattr(rejection, "residual", lambda probs, rejected: probs)
    params = SamplingParams(temperature=1.0)
    sampler = RejectionSampler(Sampler(seed=11))
    num = 40_000
    results = sampler.verify(LOGITS.repeat(num, 1), _drafted(params, num))
    first = [r.token_ids[0] for r in results]
    assert _tv(_frequencies(first), _target(params, 0)) > 5 * 0.015


def test_logprobs_come_from_the_raw_logits_of_each_emitted_position() -> None:
    sampler = RejectionSampler(Sampler(seed=0))
    params = SamplingParams(temperature=0.0, logprobs=2, presence_penalty=1.5)
    rows = tuple(SamplingRow(params=params) for _ in range(3))
    argmaxes = LOGITS.argmax(dim=-1).tolist()
    result = sampler.verify(LOGITS, [DraftedRequest((argmaxes[0], argmaxes[1]), rows)])[0]
    raw = torch.log_softmax(LOGITS, dim=-1)
    assert len(result.logprobs) == 3
    for j, logprob in enumerate(result.logprobs):
        assert logprob is not None
        assert logprob.token_id == result.token_ids[j]
        assert logprob.logprob == pytest.approx(float(raw[j, result.token_ids[j]]))
        assert len(logprob.top_token_ids) == 2


def test_rows_must_match_the_drafts() -> None:
    with pytest.raises(ValueError, match="2 drafts need 3 rows"):
        DraftedRequest((1, 2), (SamplingRow(params=SamplingParams()),))
