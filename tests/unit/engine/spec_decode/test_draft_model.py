"""The ``draft_model`` method on the built-in models: a draft identical to the target has every
draft accepted, a different draft of the same vocabulary still leaves greedy output unchanged,
sampling keeps the target's distribution, and the draft's own KV is rolled back and freed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from core.errors import ConfigError
from core.sampling import SamplingParams
from engine.draft_proposer import DraftModelProposer
from engine.llm import LLM
from engine.outputs import RequestOutput
from engine.sampling import DraftedRequest, RejectionSampler, Sampler, SamplingRow
from engine.sampling.ops import filtered_probs
from engine.scheduler.output import ScheduledRequest
from engine.spec_decode import DraftQuery

TARGET = "builtin:tiny-llama"
PROMPTS = ["one two three one two", "the cat sat on the mat", "hello, how are you today?"]


def _spec(model: str, k: int = 3) -> dict[str, Any]:
    return {
        "method": "draft_model",
        "model": model,
        "num_speculative_tokens": k,
        "pause_unprofitable_drafts": False,  # draft every step: the counts below are exact
    }


def _llm(**kw: Any) -> LLM:
    return LLM(TARGET, max_model_len=256, kv_cache_memory_bytes=4 << 20, **kw)


@pytest.fixture(scope="module")
def base() -> Iterator[LLM]:
    with _llm() as llm:
        yield llm


def _proposer(llm: LLM) -> DraftModelProposer:
    speculation = llm.engine.speculation
    assert speculation is not None
    assert isinstance(speculation.proposer, DraftModelProposer)
    return speculation.proposer


def _generate(llm: LLM, params: SamplingParams) -> list[RequestOutput]:
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    llm.engine.scheduler.check_integrity()
    assert llm.engine.scheduler.stats().num_used_blocks == 0
    if llm.engine.speculation is not None:
        proposer = _proposer(llm)
        proposer.check_integrity()
        assert proposer.num_drafting_requests == 0  # every draft table freed
        assert proposer.pool.num_used_blocks == 0
    return outputs


def _token_ids(outputs: list[RequestOutput]) -> list[tuple[int, ...]]:
    return [o.outputs[0].token_ids for o in outputs]


def test_the_target_as_its_own_draft_has_every_draft_accepted(base: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with _llm(speculative_config=_spec(TARGET)) as spec:
        assert _token_ids(_generate(spec, params)) == _token_ids(_generate(base, params))
        stats = spec.engine.scheduler.stats().spec_decode
    assert stats.num_drafts > 0
    assert stats.num_accepted_tokens == stats.num_draft_tokens  # greedy agrees with itself


def test_another_model_of_the_same_vocabulary_leaves_greedy_output_unchanged(base: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with _llm(speculative_config=_spec("builtin:tiny-moe")) as spec:
        assert _token_ids(_generate(spec, params)) == _token_ids(_generate(base, params))
        stats = spec.engine.scheduler.stats().spec_decode
    assert stats.num_drafts > 0
    assert stats.num_accepted_tokens < stats.num_draft_tokens  # a different model: rejections


def test_an_aborted_request_gives_its_draft_blocks_back() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    with _llm(speculative_config=_spec(TARGET)) as spec:
        engine = spec.engine
        engine.add_request("a", list(range(5, 30)), params)
        for _ in range(4):
            engine.step()
        proposer = _proposer(spec)
        assert proposer.num_drafting_requests == 1 and proposer.pool.num_used_blocks > 0
        assert engine.abort("a")
        assert proposer.num_drafting_requests == 0 and proposer.pool.num_used_blocks == 0
        proposer.check_integrity()


def test_a_draft_of_another_vocabulary_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        _llm(speculative_config=_spec("builtin:smollm2-135m-instruct"))
    assert "a draft must share the target's vocabulary" in info.value.message
    assert "\n" not in info.value.message


def test_rejected_drafts_are_rolled_back_in_the_draft_kv() -> None:
    """Drafting after a rejection computes from the first rejected position on, and drafts
    what a fresh proposer would for the same tokens."""
    with _llm(speculative_config=_spec(TARGET)) as spec:
        proposer = _proposer(spec)
        tokens = list(range(7, 27))
        first = proposer.propose_batch([DraftQuery("r", tokens, len(tokens), 3)])[0]
        assert len(first) == 3
        # the target kept one draft and sampled a different token after it
        rejected = [*tokens, first[0], (first[1] + 1) % 320]
        again = proposer.propose_batch([DraftQuery("r", rejected, len(tokens), 3)])[0]
        proposer.finish("r")
        fresh = proposer.propose_batch([DraftQuery("f", rejected, len(tokens), 3)])[0]
        proposer.finish("f")
        assert again == fresh
        proposer.check_integrity()
        assert proposer.pool.num_used_blocks == 0


def test_sampling_with_model_drafts_keeps_the_target_distribution() -> None:
    """The statistical harness of ``test_rejection.py`` with the draft model's own drafts for
    a real context and the target's logits there: the emitted first token follows the target
    (top-k 6 keeps the support small enough for the bound)."""
    params = SamplingParams(temperature=0.8, top_k=6)
    with _llm(speculative_config=_spec("builtin:tiny-moe", k=2)) as spec:
        proposer = _proposer(spec)
        tokens = list(range(40, 60))
        drafts = proposer.propose_batch([DraftQuery("s", tokens, len(tokens), 2)])[0]
        proposer.finish("s")
        logits = _target_logits(spec, [*tokens, *drafts], len(drafts) + 1)  # [k + 1, vocab]
    rows = tuple(SamplingRow(params=params) for _ in range(len(drafts) + 1))
    num = 40_000
    sampler = RejectionSampler(Sampler(seed=3))
    results = sampler.verify(logits.repeat(num, 1), [DraftedRequest(tuple(drafts), rows)] * num)
    first = torch.tensor([r.token_ids[0] for r in results])
    counts = torch.bincount(first, minlength=logits.shape[-1]).double()
    target = filtered_probs(logits[:1], torch.tensor([0.8]), torch.tensor([6]), None)[0]
    tv = 0.5 * float((counts / num - target.double()).abs().sum())
    assert tv < 0.015


def _target_logits(llm: LLM, token_ids: list[int], num_rows: int) -> torch.Tensor:
    """The target model's logits [num_rows, vocab] at the last ``num_rows`` positions of
    ``token_ids``, scored as one verify row on the idle engine's blocks."""
    runner = llm.engine.runner
    block_size = runner.block_size
    num_blocks = -(-len(token_ids) // block_size)
    block_ids = list(range(1, num_blocks + 1))  # an idle engine: any blocks are free
    drafts = tuple(token_ids[len(token_ids) - num_rows + 1 :])
    row = ScheduledRequest(
        request_id="score",
        token_ids=token_ids,
        start_position=0,
        block_ids=block_ids,
        samples_token=True,
        sampling_params=SamplingParams(temperature=0.0),
        num_output_tokens=0,
        draft_token_ids=drafts,
    )
    return runner.execute([row]).verify_logits["score"]
