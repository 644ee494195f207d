"""CUDA graphs and speculation: verify steps (rows of k + 1 tokens) have no graph buckets yet,
so they run eagerly (or compiled) while the plain decode steps of a speculating engine still
replay their buckets. Checked on CPU with the graph runner's eager stand-in."""

from __future__ import annotations

from typing import Any

from engine import LLM, SamplingParams
from engine.scheduler.output import ScheduledRequest
from tests.unit.engine.cuda_graphs.test_runner_routing import EagerBuckets

MODEL = "builtin:tiny-llama"
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 1,
    "pause_unprofitable_drafts": False,
}


def test_verify_steps_run_eagerly_and_plain_decode_steps_replay() -> None:
    prompts = [[5, 6, 7, 8] * 4, [9, 10] * 6, [11 + i for i in range(9)]]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    expected = LLM(MODEL, max_num_seqs=8).generate(prompt_token_ids=prompts, sampling_params=params)
    llm = LLM(MODEL, max_num_seqs=8, speculative_config=NGRAM)
    runner = llm.engine.runner
    fake = EagerBuckets(runner, (1, 2, 4))
    runner.graphs = fake  # type: ignore[assignment]
    steps: list[tuple[bool, bool]] = []  # (a verify step, replayed)
    execute = runner.execute

    def recording(scheduled: list[ScheduledRequest], pending: Any = None) -> Any:
        num_replays = len(fake.replayed)
        logits = execute(scheduled, pending)
        verifies = any(item.draft_token_ids for item in scheduled)
        steps.append((verifies, len(fake.replayed) > num_replays))
        return logits

    runner.execute = recording  # type: ignore[method-assign]
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
    assert (True, False) in steps  # verify steps ran, eagerly
    # a request asking for prompt logprobs never drafts: its decode steps are plain ones
    plain = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, prompt_logprobs=0)
    llm.generate(prompt_token_ids=prompts[:1], sampling_params=plain)
    assert (True, True) not in steps  # never through a decode bucket
    assert (False, True) in steps  # plain decode steps still replay
    llm.engine.scheduler.check_integrity()
