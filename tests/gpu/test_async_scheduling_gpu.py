"""Overlapped steps on CUDA: the same tokens as plain steps, and decode steps that never make
the host wait for the device except through the reader's one read a step."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from tests.gpu.helpers import fresh_seed, gpu_llm, random_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

MODEL = "builtin:tiny-llama"


def test_auto_overlaps_on_cuda() -> None:
    assert gpu_llm(MODEL).engine.async_scheduling


@pytest.mark.parametrize("eager", [False, True])
def test_greedy_tokens_match_plain_steps(eager: bool) -> None:
    seed = fresh_seed()
    overlapped = gpu_llm(MODEL, async_scheduling="on", enforce_eager=eager)
    plain = gpu_llm(MODEL, async_scheduling="off", enforce_eager=eager)
    vocab = overlapped.engine.parts.arch.vocab_size
    prompts = random_prompts([5, 40, 130, 17, 260, 64, 9, 33], vocab, seed)
    params = [
        SamplingParams(temperature=0.0, max_tokens=4 + 9 * i, ignore_eos=i % 2 == 0)
        for i in range(len(prompts))
    ]
    params[3] = SamplingParams(temperature=0.9, top_p=0.8, seed=seed, max_tokens=30)
    params[5] = SamplingParams(temperature=0.0, max_tokens=20, logprobs=2)
    params[6] = SamplingParams(temperature=0.0, max_tokens=25, presence_penalty=0.7)
    got = overlapped.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    want = plain.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want], seed
    overlapped.engine.scheduler.check_integrity()


@pytest.mark.parametrize("batch", [1, 5])
def test_decode_steps_never_synchronise_outside_the_reader(batch: int) -> None:
    llm: LLM = gpu_llm(MODEL, async_scheduling="on")
    engine = llm.engine
    vocab = engine.parts.arch.vocab_size
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for i, prompt in enumerate(random_prompts([30 + 7 * i for i in range(batch)], vocab, 1)):
        engine.add_request(f"r{i}", prompt, params)
    for _ in range(3):  # prefill and the first decodes
        engine.step()
    waits = engine.reader.num_waits
    with engine.reader.forbid_other_syncs():
        for _ in range(20):
            engine.step()  # raises on any synchronising call but the reader's
    assert engine.reader.num_waits - waits <= 20
    while engine.has_unfinished():
        engine.step()
