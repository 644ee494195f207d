"""Which steps the model runner sends to the CUDA-graph runner, and what it hands it.

No CUDA here: a stand-in with the graph runner's interface runs each padded step's real rows
eagerly, after checking the padding arithmetic against ``AttentionMetadata.build``. Outputs must
equal a plain engine's, decode steps must go to the smallest bucket, and prefill or mixed steps
and batches larger than every bucket must stay eager.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention.metadata import AttentionMetadata
from engine.cuda_graphs import PaddedDecode, pick_bucket
from engine.model_runner import ModelRunner

MODEL = "builtin:tiny-llama"


class EagerBuckets:
    """``CudaGraphRunner``'s interface, replaying nothing: the real rows run eagerly."""

    def __init__(self, runner: ModelRunner, batch_sizes: tuple[int, ...]) -> None:
        self.runner = runner
        self.batch_sizes = batch_sizes
        self.max_table_width = 64
        self.replayed: list[tuple[int, int]] = []  # (bucket, num_seqs)

    def replay(
        self, padded: PaddedDecode, fill_inputs: Callable[[torch.Tensor], None] | None = None
    ) -> torch.Tensor:
        n = padded.num_seqs
        assert padded.bucket in self.batch_sizes and n <= padded.bucket
        assert padded.slot_mapping[n:] == [-1] * padded.num_padding
        meta = AttentionMetadata.build(
            [1] * n, padded.seq_lens[:n], padded.block_tables[:n], self.runner.block_size
        )
        assert meta.slot_mapping.tolist() == padded.slot_mapping[:n]
        assert padded.positions[:n] == [s - 1 for s in padded.seq_lens[:n]]
        self.replayed.append((padded.bucket, n))
        model = self.runner.model
        ids = torch.tensor(padded.token_ids)
        if fill_inputs is not None:
            fill_inputs(ids)  # pending ids from the step before (overlapped steps)
        ids = ids[:n]
        positions = torch.tensor(padded.positions[:n])
        hidden = model(ids, positions, self.runner.storage.kv, meta)  # [n, H]
        return model.compute_logits(hidden)


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_decode_steps_replay_in_the_smallest_bucket_and_match_eager(overlap: str) -> None:
    prompts = [[5 + i] * (3 + 7 * i) for i in range(5)]
    params = [
        SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (3, 6, 9, 9, 14)
    ]
    expected = LLM(MODEL, max_num_seqs=8).generate(prompt_token_ids=prompts, sampling_params=params)

    llm = LLM(MODEL, max_num_seqs=8, max_num_batched_tokens=16, async_scheduling=overlap)  # type: ignore[arg-type]
    runner = llm.engine.runner
    assert runner.graphs is None  # never on CPU
    fake = EagerBuckets(runner, (1, 2, 4))
    runner.graphs = fake  # type: ignore[assignment]
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)

    assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
    used = set(fake.replayed)
    # every replay used the smallest bucket holding its batch; a 3-request batch was padded
    assert all(bucket == pick_bucket(n, fake.batch_sizes) for bucket, n in used)
    assert {(4, 3), (2, 2), (1, 1)} <= used
    # chunked prefill (16-token budget) mixes prefill chunks into early steps: those ran eagerly,
    # so fewer steps were replayed than decode tokens were produced
    assert len(fake.replayed) < sum(len(o.token_ids) for o in outs)
    llm.engine.scheduler.check_integrity()


def test_batches_beyond_every_bucket_stay_eager() -> None:
    prompts = [[7] * 9, [8] * 9]
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    llm = LLM(MODEL, max_num_seqs=8)
    expected = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    fake = EagerBuckets(llm.engine.runner, (1,))
    llm.engine.runner.graphs = fake  # type: ignore[assignment]
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    assert fake.replayed == []  # two requests decode together to the end: never a bucket of 1
    assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
    single = llm.generate(prompt_token_ids=prompts[:1], sampling_params=params)
    assert fake.replayed == [(1, 1)] * 4  # 5 tokens: one from the prefill, 4 decode replays
    assert single[0].token_ids == expected[0].token_ids
