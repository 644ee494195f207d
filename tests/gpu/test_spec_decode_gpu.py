"""Speculative decoding on CUDA with captured decode graphs: greedy output equals the engine
without speculation, verify steps (k + 1 tokens per row) run eagerly — they have no graph
buckets yet — and the plain decode steps between them still replay their buckets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from engine import SamplingParams
from engine.cuda_graphs import PaddedDecode
from engine.scheduler.output import ScheduledRequest
from tests.gpu.helpers import fresh_seed, gpu_llm, random_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

DENSE = "builtin:tiny-llama"


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_speculating_with_graphs_equals_no_speculation(method: str) -> None:
    seed = fresh_seed()
    prompts = [p * 3 for p in random_prompts([4, 7, 11, 5], 320, seed)]  # repeats to draft from
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    expected = gpu_llm(DENSE, dtype="float32", max_num_seqs=8).generate(
        prompt_token_ids=prompts, sampling_params=params
    )
    spec = {"method": method, "num_speculative_tokens": 3, "pause_unprofitable_drafts": False}
    if method == "ngram":
        spec["prompt_lookup_min"] = 1
    llm = gpu_llm(DENSE, dtype="float32", max_num_seqs=8, speculative_config=spec)
    runner = llm.engine.runner
    graphs = runner.graphs
    assert graphs is not None
    replays: list[int] = []
    replay = graphs.replay

    def counting(padded: PaddedDecode, fill: Callable[[torch.Tensor], None] | None = None) -> Any:
        replays.append(padded.num_seqs)
        return replay(padded, fill)

    graphs.replay = counting  # type: ignore[method-assign,assignment]
    steps: list[tuple[bool, bool]] = []
    execute = runner.execute

    def recording(scheduled: list[ScheduledRequest], pending: Any = None) -> Any:
        before = len(replays)
        logits = execute(scheduled, pending)
        steps.append((any(i.draft_token_ids for i in scheduled), len(replays) > before))
        return logits

    runner.execute = recording  # type: ignore[method-assign]
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in expected], f"seed={seed}"
    # a request asking for prompt logprobs never drafts: its decode steps are plain ones
    plain = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, prompt_logprobs=0)
    llm.generate(prompt_token_ids=prompts[:1], sampling_params=plain)
    assert (True, True) not in steps
    assert (True, False) in steps, f"seed={seed}: no verify step ran"
    assert (False, True) in steps, f"seed={seed}: no decode step replayed"
    llm.engine.scheduler.check_integrity()
