"""``prompt_logprobs``: every prompt token's log-probability given the ones before it, equal to
HF transformers' log-softmax over the same positions, unchanged by chunked prefill, and never
served from the prefix cache (which holds no logits)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from core.errors import SamplingParamsError
from engine import LLM, SamplingParams
from tests.unit.engine.models.hf_checkpoints import HFCheckpoint

PROMPT = [3, 17, 40, 9, 3, 17, 22, 8, 11, 5, 60, 2, 7, 19, 33, 4, 21]


def hf_prompt_logprobs(ckpt: HFCheckpoint, prompt: list[int]) -> torch.Tensor:
    """log p(prompt[i] | prompt[:i]) for i >= 1, from HF transformers."""
    with torch.inference_mode():
        logits = ckpt.hf_model(torch.tensor([prompt])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return logprobs[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]


@pytest.mark.parametrize("chunk", [2048, 5])  # one prefill step, or chunks of 5 tokens
def test_prompt_logprobs_match_hf_under_chunking_and_the_prefix_cache(
    checkpoint: Callable[[str], HFCheckpoint], chunk: int
) -> None:
    ckpt = checkpoint("llama")
    llm = LLM(str(ckpt.path), block_size=4, max_num_batched_tokens=chunk,
              long_prefill_token_threshold=chunk)  # fmt: skip
    params = SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=3)
    expected = hf_prompt_logprobs(ckpt, PROMPT)
    for _ in range(2):  # the second run's prompt is cached, yet computed again
        out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params, use_tqdm=False)[0]
        got = out.prompt_logprobs
        assert got is not None and len(got) == len(PROMPT) and got[0] is None
        values = torch.tensor(
            [pos[tok].logprob for pos, tok in zip(got[1:], PROMPT[1:], strict=True)]
        )
        torch.testing.assert_close(values, expected, atol=1e-4, rtol=1e-4)
        assert all(len(pos) <= 4 for pos in got[1:])  # the token plus the top 3
        ranks = [min(p.rank for p in pos.values() if p.rank is not None) for pos in got[1:]]
        assert ranks == [1] * (len(PROMPT) - 1)  # the top-3 always includes rank 1
    assert out.num_cached_tokens == 0


def test_bad_prompt_logprobs_name_the_field() -> None:
    with pytest.raises(SamplingParamsError) as err:
        SamplingParams(prompt_logprobs=21)
    assert err.value.param == "prompt_logprobs"
