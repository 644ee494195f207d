"""pdserve's MoE engine on one GPU against HF transformers and against the active-bytes roofline.

One run, the GPU MoE built-in (``builtin:gpu-moe``: Qwen3-MoE-shaped, 64 experts, top-8, ~5.1B
parameters of which ~0.85B active), bf16 on both sides, HF ``generate()`` with a static cache as
the peer. Progress goes to stderr; the last stdout line is one JSON object:

- ``moe_tpot_b1_ms`` (and ``hf_moe_tpot_b1_ms``): batch-1 time per output token, 256-token
  prompt, 128 new tokens; ``moe_tpot_b1_ratio`` ours over HF (target <= 0.3).
- ``moe_throughput_b64_ratio``: batch-64 output tokens/s over HF's (target >= 4).
- ``moe_bandwidth_utilisation_b1``: bytes a batch-1 decode step must read — attention and router
  weights, the *active* experts (``top_k`` of ``num_experts`` per layer), the LM head, one
  embedding row and the context's KV — over our TPOT, divided by the measured copy bandwidth
  (target >= 0.5).
- ``fused_moe_us``: one MoE layer's forward at 1 and 64 tokens, CUDA events, after warm-up.
- ``cuda_graph_batch_sizes``: the decode graphs the engine captured (empty: MoE ran eagerly).

Usage: ``python benchmarks/gpu_moe.py [--model builtin:gpu-moe] [--repeats 3]`` (run from the
repository root with it on ``PYTHONPATH``, as ``gpu_engine.py``; shares its timing helpers).
Needs CUDA: without it the script exits with a message and status 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import torch

from engine.models import CausalLM, MoELayer

logger = logging.getLogger("gpu_moe")

PROMPT_LEN, NEW_TOKENS, BATCH = 256, 128, 64
TARGETS = {
    "moe_tpot_b1_ratio": ("<=", 0.3),
    "moe_throughput_b64_ratio": (">=", 4.0),
    "moe_bandwidth_utilisation_b1": (">=", 0.5),
}


def moe_decode_bytes_per_step(
    model: CausalLM, kv_bytes_per_token: int, context_len: float
) -> float:
    """Bytes a batch-1 decode step reads: every weight except the experts a token does not
    route to (``num_experts - top_k`` per MoE layer) and all but one row of the embedding
    table, plus K and V of ``context_len`` tokens in every layer."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    for module in model.modules():
        if isinstance(module, MoELayer):
            experts = [module.gate_up_proj, module.down_proj]
            expert_bytes = sum(p.numel() * p.element_size() for p in experts)
            idle = max(len(module.expert_ids) - module.top_k, 0) / len(module.expert_ids)
            weights -= expert_bytes * idle
    table = model.embed_tokens.weight
    if model.lm_head is not None:  # untied: the lookup reads one row of the table, not all
        weights -= (table.shape[0] - 1) * table.shape[1] * table.element_size()
    return weights + kv_bytes_per_token * context_len


def moe_layer_us(layer: MoELayer, num_tokens: int, hidden: int, iters: int = 50) -> float:
    """Mean microseconds of ``layer``'s forward over ``num_tokens`` random bf16 rows."""
    x = torch.randn(num_tokens, hidden, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        for _ in range(5):
            layer(x)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            layer(x)
        end.record()
        end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:gpu-moe")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-gib", type=float, default=8.0, help="our engine's KV budget")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu_moe.py needs a CUDA GPU: torch.cuda.is_available() is False")
    from gpu_engine import (  # a sibling script: its timing and HF helpers
        copy_bandwidth_gbps,
        hf_generate,
        meets,
        ours_generate,
        paired_best,
        progress,
        random_prompts,
    )
    from transformers import AutoModelForCausalLM

    from engine import LLM
    from engine.builtin import resolve_model

    start = time.perf_counter()
    model_dir = resolve_model(args.model)  # writes the built-in on first use
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    llm = LLM(
        args.model,
        dtype="bfloat16",
        max_model_len=PROMPT_LEN + NEW_TOKENS + 16,
        max_num_seqs=BATCH,
        enable_prefix_caching=False,  # HF has none, and the loops repeat their prompts
        kv_cache_memory_bytes=int(args.kv_gib * 2**30),
    )
    build_s = time.perf_counter() - start
    parts = llm.engine.parts
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16).cuda().eval()
    vocab = parts.arch.vocab_size
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "model": args.model,
        "parameters": sum(p.numel() for p in parts.model.parameters()),
        "dtype": "bfloat16",
        "checkpoint_write_s": write_s,
        "engine_build_s": build_s,
        "cuda_graph_batch_sizes": list(parts.cuda_graph_batch_sizes),
    }
    copy_bw = copy_bandwidth_gbps()
    progress(result)

    logger.info("batch 1: %d-token prompt, %d new tokens", PROMPT_LEN, NEW_TOKENS)
    one = random_prompts(1, PROMPT_LEN, vocab, seed=1)
    t = paired_best(
        args.repeats,
        {
            "hf1": hf_generate(hf, one, 1),
            "hfn": hf_generate(hf, one, NEW_TOKENS),
            "us1": ours_generate(llm, one, 1),
            "usn": ours_generate(llm, one, NEW_TOKENS),
        },
    )
    hf_tpot = (t["hfn"] - t["hf1"]) / (NEW_TOKENS - 1)
    us_tpot = (t["usn"] - t["us1"]) / (NEW_TOKENS - 1)
    result["moe_tpot_b1_ms"] = us_tpot * 1e3
    result["hf_moe_tpot_b1_ms"] = hf_tpot * 1e3
    result["moe_tpot_b1_ratio"] = us_tpot / hf_tpot
    step_bytes = moe_decode_bytes_per_step(
        parts.model, parts.layout.bytes_per_token, PROMPT_LEN + NEW_TOKENS / 2
    )
    result["copy_bandwidth_gbps"] = copy_bw
    result["moe_decode_bytes_per_step_b1"] = step_bytes
    result["moe_bandwidth_utilisation_b1"] = step_bytes / us_tpot / 1e9 / copy_bw

    layer = next(m for m in parts.model.modules() if isinstance(m, MoELayer))
    hidden = parts.arch.hidden_size
    result["fused_moe_us"] = {
        "b1": moe_layer_us(layer, 1, hidden),
        "b64": moe_layer_us(layer, 64, hidden),
    }
    progress(result)

    logger.info("batch %d: %d-token prompts, %d new tokens", BATCH, PROMPT_LEN, NEW_TOKENS)
    many = random_prompts(BATCH, PROMPT_LEN, vocab, seed=2)
    t = paired_best(
        args.repeats,
        {"hf": hf_generate(hf, many, NEW_TOKENS), "us": ours_generate(llm, many, NEW_TOKENS)},
    )
    tokens = BATCH * NEW_TOKENS
    result["moe_throughput_b64_tok_s"] = {"ours": tokens / t["us"], "hf": tokens / t["hf"]}
    result["moe_throughput_b64_ratio"] = t["hf"] / t["us"]

    result["targets"] = {k: f"{op} {v}" for k, (op, v) in TARGETS.items()}
    result["met"] = {k: meets(float(result[k]), *TARGETS[k]) for k in TARGETS}  # type: ignore[arg-type]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
