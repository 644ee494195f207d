"""Quantization against full precision, in one run on the same cores.

The model is a mid-size random Llama written for this benchmark (hidden 768, 12 layers, MLP
3072, 6 query heads over 2 KV heads of head_dim 128, as in Llama 3 8B: ~98M parameters, 390 MB
in fp32), large enough that batch-1 decode on a CPU streams its weights every step.

- **KV capacity**: tokens the engine really allocates in one fixed KV budget with
  ``kv_cache_dtype`` int8 and fp8_e4m3 against a bf16 and an fp32 cache (scales included).
- **Wire bytes**: bytes a prefill exports per prompt token (its pinned blocks), 8-bit / bf16.
- **KV accuracy**: top-1 agreement and mean KL(model-dtype cache || 8-bit cache) of the next
  token after a 256-token prompt and along its greedy continuation (teacher forcing).
- **Weight-only int8**: batch-1 time per output token (TPOT, best of ``--repeats``) with fp32
  weights and ``model.quantization: int8``, with its top-1 agreement and KL; bf16 weights
  against fp32 are the reference for how much any rounding moves this random model's nearly
  flat distributions.

Prints a table, then one JSON object last. Usage: ``python benchmarks/quantization.py``.
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
    """The tiny Llama's config scaled up to ~98M parameters, head_dim 128."""
    base = BUILTIN_SPECS["tiny-llama"]
    config: dict[str, Any] = {
        **base.config,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "intermediate_size": 3072,
    }
    return BuiltinSpec(name="bench-llama-100m", config=config, seed=base.seed, tiny=False)


def kv_tokens(model_dir: Path, kv_cache_dtype: str, dtype: str, budget: int) -> int:
    """Tokens of KV the engine allocates in ``budget`` bytes."""
    llm = LLM(
        str(model_dir),
        dtype=dtype,  # type: ignore[arg-type]
        max_model_len=512,
        kv_cache_memory_bytes=budget,
        kv_cache_dtype=kv_cache_dtype,  # type: ignore[arg-type]
    )
    return llm.engine.scheduler.kv.pool.num_usable_blocks * llm.engine.parts.layout.block_size


def wire_bytes_per_token(llm: LLM, prompt: list[int]) -> float:
    """Bytes a prefill-only request exports per prompt token (its pinned blocks)."""
    engine = llm.engine
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    engine.add_request("wire", prompt, params, prefill_only=True)
    while engine.has_unfinished():
        engine.step()
    pinned = engine.get_pinned_blocks("wire")
    assert pinned is not None
    engine.release("wire")
    return len(pinned.block_ids) * engine.parts.layout.block_bytes / len(prompt)


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
    long_prompt = [(7 * i) % 300 + 3 for i in range(256)]
    options: dict[str, Any] = {"max_model_len": 512, "kv_cache_memory_bytes": 64 << 20}
    result: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "bench-llama-100m"
        model_dir.mkdir()
        write_checkpoint(mid_llama_spec(), model_dir)
        budget = 64 << 20
        tokens = {
            name: kv_tokens(model_dir, kv, dtype, budget)
            for name, kv, dtype in (
                ("fp32", "auto", "float32"),
                ("bf16", "auto", "bfloat16"),
                ("int8", "int8", "float32"),
                ("fp8", "fp8_e4m3", "float32"),
            )
        }
        eight_bit = min(tokens["int8"], tokens["fp8"])
        result["kv_capacity_8bit_vs_bf16_ratio"] = round(eight_bit / tokens["bf16"], 3)
        result["kv_capacity_8bit_vs_fp32_ratio"] = round(eight_bit / tokens["fp32"], 3)
        print(f"KV tokens in {budget >> 20} MiB: {tokens}")

        full = LLM(str(model_dir), **options)
        kv_runs = {
            kv: LLM(str(model_dir), kv_cache_dtype=kv, **options) for kv in ("int8", "fp8_e4m3")
        }
        bf16 = LLM(str(model_dir), dtype="bfloat16", **options)
        wire_bf16 = wire_bytes_per_token(bf16, long_prompt)
        wire_8bit = max(wire_bytes_per_token(llm, long_prompt) for llm in kv_runs.values())
        result["wire_bytes_8bit_vs_bf16_ratio"] = round(wire_8bit / wire_bf16, 3)
        print(f"wire bytes per prompt token: bf16 {wire_bf16:.0f}, 8-bit {wire_8bit:.0f}")
        kv_accuracy = {
            kv: agreement(full, llm, long_prompt, args.agreement_tokens)
            for kv, llm in kv_runs.items()
        }
        for kv, (top1, kl) in kv_accuracy.items():
            print(f"{kv} KV vs fp32 KV: top-1 agreement {top1:.3f}, mean KL {kl:.5f} nats")
            result[f"{kv}_kv_top1_agreement"] = round(top1, 3)
            result[f"{kv}_kv_mean_kl"] = round(kl, 6)
        result["top1_agreement"] = min(top1 for top1, _ in kv_accuracy.values())
        result["mean_kl"] = max(kl for _, kl in kv_accuracy.values())
        del kv_runs

        int8 = LLM(str(model_dir), quantization="int8", **options)
        tpot_full = tpot_s(full, prompt, args.decode_tokens, args.repeats)
        tpot_int8 = tpot_s(int8, prompt, args.decode_tokens, args.repeats)
        top1, kl = agreement(full, int8, prompt, args.agreement_tokens)
        top1_bf16, kl_bf16 = agreement(full, bf16, prompt, args.agreement_tokens)
    print(f"batch-1 TPOT: fp32 {tpot_full * 1e3:.1f} ms, int8 weights {tpot_int8 * 1e3:.1f} ms")
    print(f"int8 weights vs fp32: top-1 agreement {top1:.3f}, mean KL {kl:.5f} nats")
    print(f"bf16 weights vs fp32 (reference): top-1 {top1_bf16:.3f}, mean KL {kl_bf16:.5f}")
    result.update(
        {
            "int8_weights_tpot_ratio": round(tpot_int8 / tpot_full, 3),
            "int8_weights_top1_agreement": round(top1, 3),
            "int8_weights_mean_kl": round(kl, 6),
            "bf16_weights_top1_agreement": round(top1_bf16, 3),
            "bf16_weights_mean_kl": round(kl_bf16, 6),
        }
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
