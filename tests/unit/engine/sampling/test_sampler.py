"""Sampler: greedy, top-k/top-p, seeds, min_tokens, distributions and logprobs."""

from __future__ import annotations

import pytest
import torch

from core.sampling import SamplingParams
from engine.sampling import Sampler, SamplingRow, make_generator
from engine.sampling import ops as sampling_ops

VOCAB = 64
EOS = 5


def _logits(batch: int, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, VOCAB, generator=generator) * scale  # [B, V]


def _rows(params: SamplingParams, batch: int, **kwargs: object) -> list[SamplingRow]:
    return [SamplingRow(params=params, **kwargs) for _ in range(batch)]  # type: ignore[arg-type]


def test_greedy_is_argmax_in_one_vectorised_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> torch.Tensor:
        raise AssertionError("greedy rows must not go through the random path")

    monkeypatch.setattr(sampling_ops, "sample_from_logits", fail)
    logits = _logits(16)
    out = Sampler(seed=0).sample(logits, _rows(SamplingParams(temperature=0.0), 16))
    assert out.token_ids == logits.argmax(dim=-1).tolist()
    assert len(out.token_ids) == len(out.logprobs)
    assert out.logprobs == [None] * 16


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=2.0, top_p=1e-6),
        SamplingParams(temperature=0.7, top_k=3, top_p=1e-6),
        SamplingParams(temperature=1e-7),  # below the greedy threshold
    ],
)
def test_degenerate_filters_equal_greedy(params: SamplingParams) -> None:
    logits = _logits(32, seed=1)
    sampler = Sampler(seed=0)
    for step in range(5):
        rows = [SamplingRow(params, generator=make_generator(step * 100 + i)) for i in range(32)]
        assert sampler.sample(logits, rows).token_ids == logits.argmax(dim=-1).tolist()


def _seeded_tokens(sampler: Sampler, batch: list[tuple[torch.Tensor, SamplingRow]]) -> list[int]:
    logits = torch.stack([row_logits for row_logits, _ in batch])  # [B, V]
    return sampler.sample(logits, [row for _, row in batch]).token_ids


def test_seed_reproducible_regardless_of_batch_neighbours() -> None:
    params = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=42)
    own_logits = _logits(12, seed=2, scale=1.0)  # one row per step: a flat-ish distribution
    neighbour_logits = _logits(12 * 4, seed=3)

    alone_gen = make_generator(42)
    alone = [
        _seeded_tokens(Sampler(seed=1), [(own_logits[s], SamplingRow(params, s, (), alone_gen))])[0]
        for s in range(12)
    ]
    crowd_gen, crowd_sampler = make_generator(42), Sampler(seed=99)
    neighbours = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.3),  # unseeded: draws from the shared generator
        SamplingParams(temperature=0.5, top_k=2, seed=7),
    ]
    crowd = []
    for s in range(12):
        others = [
            (neighbour_logits[s * 4 + j], SamplingRow(p, s, (), make_generator(7)))
            for j, p in enumerate(neighbours)
        ]
        batch = [others[0], others[1], (own_logits[s], SamplingRow(params, s, (), crowd_gen))]
        batch.append(others[2])
        crowd.append(_seeded_tokens(crowd_sampler, batch)[2])
    assert alone == crowd
    other_seed_gen = make_generator(43)
    other_seed = [
        _seeded_tokens(Sampler(), [(own_logits[s], SamplingRow(params, s, (), other_seed_gen))])[0]
        for s in range(12)
    ]
    assert other_seed != alone  # the seed matters (12 draws from a flat distribution)


def test_min_tokens_masks_eos_and_stop_tokens() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, EOS], logits[0, 9], logits[0, 11] = 10.0, 9.0, 8.0
    params = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=(9,), max_tokens=8)
    sampler = Sampler()
    below = SamplingRow(params, num_generated_tokens=2, eos_token_ids=(EOS,))
    reached = SamplingRow(params, num_generated_tokens=3, eos_token_ids=(EOS,))
    assert sampler.sample(logits, [below]).token_ids == [11]
    assert sampler.sample(logits, [reached]).token_ids == [EOS]
    # Random rows are masked too: EOS and the stop token are never drawn.
    random_params = SamplingParams(temperature=5.0, min_tokens=4, stop_token_ids=(9,))
    rows = _rows(random_params, 512, num_generated_tokens=0, eos_token_ids=(EOS,))
    drawn = set(sampler.sample(logits.expand(512, VOCAB), rows).token_ids)
    assert EOS not in drawn and 9 not in drawn and len(drawn) > 20


def test_ignore_eos_does_not_mask_eos() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, EOS] = 10.0
    row = SamplingRow(SamplingParams(temperature=0.0, ignore_eos=True), 0, (EOS,))
    assert Sampler().sample(logits, [row]).token_ids == [EOS]  # the engine just doesn't stop


def _chi_square(tokens: list[int], probs: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(tokens), minlength=probs.numel()).double()
    expected = probs.double() * len(tokens)
    support = expected > 0
    assert counts[~support].sum() == 0, "a token outside the support was drawn"
    return float(((counts[support] - expected[support]) ** 2 / expected[support]).sum())


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_temperature_distribution(temperature: float) -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    num_draws = 6000
    rows = _rows(SamplingParams(temperature=temperature), num_draws)
    tokens = Sampler(seed=123).sample(logits.expand(num_draws, -1), rows).token_ids
    probs = torch.softmax(logits[0] / temperature, dim=-1)
    # df = 5; P(chi2 > 25) ~ 1.4e-4 under the right distribution, and the seed is fixed.
    assert _chi_square(tokens, probs) < 25.0
    wrong = torch.softmax(logits[0] / (temperature * 1.5), dim=-1)
    assert _chi_square(tokens, wrong) > 25.0  # the check can tell temperatures apart


def test_top_k_and_top_p_restrict_the_support() -> None:
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.15, 0.1, 0.05]]))
    num_draws = 6000
    top_k = _rows(SamplingParams(temperature=1.0, top_k=2), num_draws)
    tokens = Sampler(seed=5).sample(logits.expand(num_draws, -1), top_k).token_ids
    assert _chi_square(tokens, torch.tensor([0.4, 0.3, 0, 0, 0]) / 0.7) < 20.0
    # top_p = 0.8: 0.4 + 0.3 = 0.7 < 0.8, so the third token is needed; the rest is cut.
    top_p = _rows(SamplingParams(temperature=1.0, top_p=0.8), num_draws)
    tokens = Sampler(seed=6).sample(logits.expand(num_draws, -1), top_p).token_ids
    assert _chi_square(tokens, torch.tensor([0.4, 0.3, 0.15, 0, 0]) / 0.85) < 20.0


def test_inverse_cdf_never_lands_on_a_masked_token() -> None:
    probs = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    almost_one = torch.tensor([1.0 - 2.0**-53, 1.0 - 2.0**-53], dtype=torch.float64)
    zero = torch.zeros(2, dtype=torch.float64)
    assert sampling_ops._inverse_cdf(probs, almost_one).tolist() == [1, 1]
    assert sampling_ops._inverse_cdf(probs, zero).tolist() == [0, 1]


def test_logprobs_match_log_softmax_of_raw_logits() -> None:
    logits = _logits(3, seed=4)
    params = [
        SamplingParams(temperature=0.0, logprobs=5),
        SamplingParams(temperature=0.7, top_k=4, logprobs=0, seed=1, min_tokens=2),
        SamplingParams(temperature=1.0),
    ]
    rows = [
        SamplingRow(params[0]),
        SamplingRow(params[1], 0, (EOS,), make_generator(1)),
        SamplingRow(params[2]),
    ]
    out = Sampler(seed=0).sample(logits, rows)
    reference = torch.log_softmax(logits, dim=-1)
    first, second, third = out.logprobs
    assert first is not None and second is not None and third is None
    assert first.token_id == out.token_ids[0]
    assert first.logprob == pytest.approx(reference[0].max().item(), abs=1e-6)
    assert first.rank == 1  # greedy picks the most likely token
    top_values, top_ids = reference[0].topk(5)
    assert list(first.top_token_ids) == top_ids.tolist()
    assert list(first.top_logprobs) == pytest.approx(top_values.tolist(), abs=1e-6)
    # Unmodified logits: not scaled by the temperature, EOS not masked.
    assert second.token_id == out.token_ids[1]
    assert second.logprob == pytest.approx(reference[1, out.token_ids[1]].item(), abs=1e-6)
    assert second.top_token_ids == () and second.top_logprobs == ()
    expected_rank = int((reference[1] > reference[1, out.token_ids[1]]).sum().item()) + 1
    assert second.rank == expected_rank


def test_rows_must_match_logits() -> None:
    with pytest.raises(ValueError, match="rows"):
        Sampler().sample(_logits(2), _rows(SamplingParams(), 3))
