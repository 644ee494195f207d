"""Decode through captured CUDA graphs: captured when they should be, and replay == eager."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from engine import LLM, SamplingParams
from engine.cuda_graphs import PaddedDecode, default_batch_sizes
from tests.gpu.helpers import fresh_seed, gpu_llm, random_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

DENSE, MOE = "builtin:tiny-llama", "builtin:tiny-moe"


def count_replays(llm: LLM) -> list[tuple[int, int]]:
    """Record (bucket, num_seqs) of every replay of ``llm``'s graph runner."""
    graphs = llm.engine.runner.graphs
    assert graphs is not None
    seen: list[tuple[int, int]] = []
    replay = graphs.replay

    def counting(
        padded: PaddedDecode, fill_inputs: Callable[[torch.Tensor], None] | None = None
    ) -> torch.Tensor:
        seen.append((padded.bucket, padded.num_seqs))
        return replay(padded, fill_inputs)

    graphs.replay = counting  # type: ignore[method-assign]
    return seen


def test_graphs_are_captured_unless_eager() -> None:
    dense = gpu_llm(DENSE, max_num_seqs=16)
    assert dense.engine.runner.graphs is not None
    assert dense.engine.runner.graphs.batch_sizes == default_batch_sizes(16) == (1, 2, 4, 8, 16)
    assert gpu_llm(DENSE, enforce_eager=True).engine.runner.graphs is None
    assert gpu_llm(MOE).engine.runner.graphs is not None  # the fused MoE syncs nothing
    custom = gpu_llm(DENSE, max_num_seqs=16, cuda_graph_batch_sizes=[1, 3])
    assert custom.engine.runner.graphs is not None
    assert custom.engine.runner.graphs.batch_sizes == (1, 3)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager-graphs", "compiled-graphs"])
def test_replay_matches_eager_as_the_batch_shrinks_through_buckets(compiled: bool) -> None:
    seed = fresh_seed()
    prompts = random_prompts([3, 10, 17, 24, 31, 38, 100], 320, seed)
    params = [
        SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=1)
        for n in (3, 6, 9, 12, 15, 40, 70)
    ]
    eager = gpu_llm(DENSE, dtype="float32", max_num_seqs=8, enforce_eager=True)
    expected = eager.generate(prompt_token_ids=prompts, sampling_params=params)
    graphed = gpu_llm(DENSE, dtype="float32", max_num_seqs=8, compile_model=compiled)
    replays = count_replays(graphed)
    outs = graphed.generate(prompt_token_ids=prompts, sampling_params=params)

    assert [o.token_ids for o in outs] == [o.token_ids for o in expected], f"seed={seed}"
    for out, ref in zip(outs, expected, strict=True):
        ours_seq, ref_seq = out.outputs[0], ref.outputs[0]
        assert ours_seq.logprobs is not None and ref_seq.logprobs is not None
        ours = [
            pos[t].logprob for pos, t in zip(ours_seq.logprobs, ours_seq.token_ids, strict=True)
        ]
        theirs = [
            pos[t].logprob for pos, t in zip(ref_seq.logprobs, ref_seq.token_ids, strict=True)
        ]
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    buckets = {bucket for bucket, _ in replays}
    assert {1, 2, 4, 8} <= buckets, replays  # 7 -> 8 (padded), ..., 1
    assert any(bucket > n for bucket, n in replays)  # some steps ran with padding rows
    graphed.engine.scheduler.check_integrity()


def test_replays_reuse_static_buffers_after_a_longer_context() -> None:
    # a long request leaves long block-table rows behind; short ones replayed afterwards must
    # not read its stale entries
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    long_prompt, short = random_prompts([1500, 5], 320, fresh_seed())
    eager = gpu_llm(DENSE, dtype="float32", enforce_eager=True, max_model_len=2048)
    graphed = gpu_llm(DENSE, dtype="float32", max_model_len=2048)
    for prompts in ([long_prompt], [short], [short, long_prompt]):
        expected = eager.generate(prompt_token_ids=prompts, sampling_params=params)
        outs = graphed.generate(prompt_token_ids=prompts, sampling_params=params)
        assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
