"""Quantization against full precision, in one run on the same cores.

Built so far (issue 14): **weight-only int8** on a mid-size random Llama written for this
benchmark (hidden 768, 12 layers, MLP 3072, GQA 12:4, head_dim 64: ~104M parameters, 415 MB
in fp32), large enough that batch-1 decode on a CPU streams its weights from memory every step.
It measures batch-1 time per output token (TPOT, best of ``--repeats``) with fp32 weights and
with ``model.quantization: int8``, and how often int8 greedy decoding picks the fp32 token
(top-1 agreement over teacher-forced positions) with the mean KL(fp32 || int8) of the
next-token distributions; bf16 weights against fp32 are the reference for how sensitive this
random model's nearly flat distributions are to any rounding.

The KV-cache quantization measurements (capacity per KV budget, wire bytes per token, KV
accuracy) join this script with ``engine.kv_cache_dtype``. Prints a table, then one JSON object
last. Usage: ``python benchmarks/quantization.py [--decode-tokens 32]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from core.sampling import SamplingParams
from engine.builtin.specs import BUILTIN_SPECS, BuiltinSpec
from engine.builtin.writer import write_checkpoint
from engine.llm import LLM


def mid_llama_spec() -> BuiltinSpec:
    """The tiny Llama's config scaled up to ~104M parameters."""
    base = BUILTIN_SPECS["tiny-llama"]
    config: dict[str, Any] = {
        **base.config,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "intermediate_size": 3072,
    }
    return BuiltinSpec(name="bench-llama-100m", config=config, seed=base.seed, tiny=False)


def tpot_s(llm: LLM, prompt: list[int], num_tokens: int, repeats: int) -> float:
    """Best batch-1 seconds per output token after the first."""
    params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    best = float("inf")
    for attempt in range(repeats):
        engine = llm.engine
        engine.add_request(f"tpot-{attempt}", [*prompt, 3 + attempt], params)
        stamps: list[float] = []
        while engine.has_unfinished():
            if engine.step():
                stamps.append(time.perf_counter())
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        best = min(best, statistics.median(gaps))
    return best


def agreement(full: LLM, int8: LLM, prompt: list[int], num_tokens: int) -> tuple[float, float]:
    """Top-1 agreement and mean KL(full || int8) of next-token distributions along full's
    own greedy continuation (teacher forcing: both score the same prefixes)."""
    params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    (out,) = full.generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)
    tokens = [*prompt, *out.outputs[0].token_ids]
    agree, kls = 0, []
    for end in range(len(prompt), len(tokens)):
        p = _next_token_logprobs(full, tokens[:end])
        q = _next_token_logprobs(int8, tokens[:end])
        agree += int(p.argmax() == q.argmax())
        kls.append(float((p.exp() * (p - q)).sum()))
    return agree / len(kls), statistics.fmean(kls)


def _next_token_logprobs(llm: LLM, prefix: list[int]) -> torch.Tensor:
    """The full next-token log-distribution after ``prefix``: one engine step's logits, read
    before sampling (the API caps ``logprobs`` at 20), then the request is aborted."""
    engine = llm.engine
    request_id = f"kl-{len(prefix)}"
    engine.add_request(request_id, prefix, SamplingParams(max_tokens=1, temperature=0.0))
    plan = engine.scheduler.schedule()
    logits = engine.runner.execute(plan.scheduled)
    row = logits.logits[logits.request_ids.index(request_id)].float().log_softmax(-1)
    engine.abort(request_id)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--agreement-tokens", type=int, default=24)
    args = parser.parse_args()
    prompt = list(range(10, 74))
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "bench-llama-100m"
        model_dir.mkdir()
        write_checkpoint(mid_llama_spec(), model_dir)
        options = {"max_model_len": 512, "kv_cache_memory_bytes": 64 << 20}
        full = LLM(str(model_dir), **options)  # type: ignore[arg-type]
        int8 = LLM(str(model_dir), quantization="int8", **options)  # type: ignore[arg-type]
        tpot_full = tpot_s(full, prompt, args.decode_tokens, args.repeats)
        tpot_int8 = tpot_s(int8, prompt, args.decode_tokens, args.repeats)
        top1, kl = agreement(full, int8, prompt, args.agreement_tokens)
        del int8
        bf16 = LLM(str(model_dir), dtype="bfloat16", **options)  # type: ignore[arg-type]
        top1_bf16, kl_bf16 = agreement(full, bf16, prompt, args.agreement_tokens)
    print(f"batch-1 TPOT: fp32 {tpot_full * 1e3:.1f} ms, int8 weights {tpot_int8 * 1e3:.1f} ms")
    print(f"int8 vs fp32: top-1 agreement {top1:.3f}, mean KL {kl:.5f} nats")
    print(f"bf16 vs fp32 (reference): top-1 agreement {top1_bf16:.3f}, mean KL {kl_bf16:.5f}")
    result = {
        "int8_weights_tpot_ratio": round(tpot_int8 / tpot_full, 3),
        "int8_weights_top1_agreement": round(top1, 3),
        "int8_weights_mean_kl": round(kl, 6),
        "bf16_weights_top1_agreement": round(top1_bf16, 3),
        "bf16_weights_mean_kl": round(kl_bf16, 6),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
