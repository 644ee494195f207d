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
from engine.cuda_graphs import DecodeBuffers, PaddedDecode, pick_bucket
from engine.cuda_graphs.block_table_rows import BlockTableRows
from engine.model_runner import ModelRunner

MODEL = "builtin:tiny-llama"


class EagerBuckets:
    """``CudaGraphRunner``'s interface, replaying nothing: the real rows run eagerly over the
    real static buffers and persistent block-table rows (on CPU tensors), so the derivation a
    graph records is checked against ``AttentionMetadata.build``."""

    def __init__(self, runner: ModelRunner, batch_sizes: tuple[int, ...]) -> None:
        self.runner = runner
        self.batch_sizes = batch_sizes
        self.max_table_width = 64
        cpu = torch.device("cpu")
        self.buffers = DecodeBuffers(max(batch_sizes), self.max_table_width, runner.block_size, cpu)
        self.table_rows = BlockTableRows(2 * max(batch_sizes), self.max_table_width, cpu)
        self.replayed: list[tuple[int, int]] = []  # (bucket, num_seqs)

    def replay(
        self, padded: PaddedDecode, fill_inputs: Callable[[torch.Tensor], None] | None = None
    ) -> torch.Tensor:
        n, bucket, static = padded.num_seqs, padded.bucket, self.buffers
        assert bucket in self.batch_sizes and n <= bucket
        static.load(padded)
        if fill_inputs is not None:
            fill_inputs(static.input_ids[:bucket])  # pending ids from the step before
        static.derive(bucket, self.table_rows.table)
        seq_lens = static.seq_lens[:n].tolist()
        tables = [
            row[: -(-s // self.runner.block_size)]
            for row, s in zip(static.block_tables[:n].tolist(), seq_lens, strict=True)
        ]
        meta = AttentionMetadata.build([1] * n, seq_lens, tables, self.runner.block_size)
        assert static.slot_mapping[:n].tolist() == meta.slot_mapping.tolist()
        assert static.slot_mapping[n:bucket].tolist() == [-1] * padded.num_padding
        assert static.positions[:n].tolist() == [s - 1 for s in seq_lens]
        self.replayed.append((bucket, n))
        model = self.runner.model
        hidden = model(static.input_ids[:n], static.positions[:n], self.runner.storage.kv, meta)
        return model.compute_logits(hidden)  # [n, vocab]


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
