"""pdserve's engine on one GPU against HF transformers and against the GPU's own roofline.

One run, same weights (default ``builtin:llama-1b``: 1.1B parameters, Llama-shaped), same dtype
(bf16) on both sides. Progress goes to stderr; the last stdout line is one JSON object:

- ``tpot_b1_ms`` (and ``hf_tpot_b1_ms``): batch-1 time per output token, 512-token prompt, 256
  new tokens; ``tpot_b1_ratio`` is ours over HF ``generate()`` with a static cache (target
  <= 0.5). TPOT = ``(T(256) - T(1)) / 255``.
- ``throughput_b64_ratio``: batch-64 output tokens/s, 512-token prompts, 256 new, over HF's
  (target >= 3).
- ``bandwidth_utilisation_b1``: bytes one batch-1 decode step must read (every weight but the
  embedding table, plus the KV of the average context) over our TPOT, divided by the GPU's
  measured copy bandwidth (a large device-to-device copy; target >= 0.7); ``roofline_tpot_b1_ms``
  is those bytes over that bandwidth.
- ``decode_attention_us_b1``: one layer's decode attention at batch 1 and a 640-token context,
  llama-1b's layer shape, in a captured graph (``decode_attention_timing.py``; target <= 5).
- ``host_waits_per_step``: times the host waited for the device per engine step over a batch-8
  decode (target <= 1), and ``sync_free_decode_step``: whether decode steps ran with
  ``torch.cuda.set_sync_debug_mode("error")`` set (the reader's one wait allowed).
- ``async_off``: the same batch-1/batch-64 figures and host waits of a second engine built with
  ``async_scheduling: off``, measured in the same rounds; ``engine_build_s`` the start-up cost of
  each engine (weights, KV, graph capture, compilation).
- ``prefill_tflops``: TFLOP/s achieved prefilling an 8K-token prompt in one step (linear layers
  plus causal attention), and ``prefill_tflops_ratio`` over the measured bf16 matmul rate.
- ``staging_gbps``: KV staging through the engine's pinned host mirror and side stream: export
  (device -> host, contiguous and scattered blocks) and import (host -> device), GB/s.

Each timed figure is the best of ``--repeats`` rounds interleaving HF and ours, after a warm-up.
Our engine runs with its defaults on CUDA (CUDA graphs for decode); ``--compile`` adds
``compile_model``, ``--hf-compile`` compiles HF's forward (``reduce-overhead``) as HF recommends
for static caches. Needs CUDA: without it the script exits with a message and status 1.

Usage: ``python benchmarks/gpu_engine.py [--model builtin:llama-1b] [--repeats 3] [--compile]``
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from collections.abc import Callable, Mapping
from typing import Literal

import torch

from engine import LLM, SamplingParams
from engine.builtin import resolve_model
from engine.models import CausalLM

logger = logging.getLogger("gpu_engine")

PROMPT_LEN, NEW_TOKENS, BATCH, PREFILL_LEN = 512, 256, 64, 8192
TARGETS = {
    "tpot_b1_ratio": ("<=", 0.5),
    "throughput_b64_ratio": (">=", 3.0),
    "bandwidth_utilisation_b1": (">=", 0.7),
    "prefill_tflops_ratio": (">=", 0.5),
    "decode_attention_us_b1": ("<=", 5.0),
    "host_waits_per_step": ("<=", 1.0),
}
WAIT_BATCH, WAIT_TOKENS = 8, 64


def sync_time(fn: Callable[[], object]) -> float:
    """Wall seconds of ``fn`` with the GPU drained before and after."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def paired_best(repeats: int, runs: Mapping[str, Callable[[], object]]) -> dict[str, float]:
    """Best time of each run over ``repeats`` interleaved rounds, after one warm-up each."""
    for run in runs.values():
        run()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            best[name] = min(best[name], sync_time(run))
    return best


def random_prompts(num: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """``num`` prompts of ``length`` random ids in ``3..vocab-1``."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(num)]


def copy_bandwidth_gbps(num_bytes: int = 2 << 30, iters: int = 10) -> float:
    """Device memory bandwidth seen by a large copy: (read + write bytes) / time, GB/s."""
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    seconds = sync_time(lambda: [dst.copy_(src) for _ in range(iters)]) / iters
    return 2 * num_bytes / seconds / 1e9


def matmul_tflops(size: int = 8192, iters: int = 20) -> float:
    """Dense bf16 matmul rate on ``size``-square operands, TFLOP/s."""
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    a @ b
    seconds = sync_time(lambda: [a @ b for _ in range(iters)]) / iters
    return 2 * size**3 / seconds / 1e12


def decode_bytes_per_step(model: CausalLM, kv_bytes_per_token: int, context_len: float) -> float:
    """Bytes a batch-1 decode step reads: every weight except the embedding table (one row of
    it), plus K and V of ``context_len`` tokens in every layer."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    table = model.embed_tokens.weight
    if model.lm_head is not None:  # untied: the lookup reads one row of the table, not all
        weights -= (table.shape[0] - 1) * table.shape[1] * table.element_size()
    return weights + kv_bytes_per_token * context_len


def prefill_flops(model: CausalLM, num_tokens: int) -> float:
    """FLOPs of one causal prefill of ``num_tokens``: 2 per weight per token in the decoder's
    linear layers, plus ``2 * heads * head_dim * T^2`` per layer for QK^T and PV (causal)."""
    linear = sum(p.numel() for p in model.layers.parameters() if p.ndim >= 2)
    cfg = model.config
    attention = 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * num_tokens**2
    return 2 * linear * num_tokens + attention


def hf_generate(hf: torch.nn.Module, prompts: list[list[int]], n: int) -> Callable[[], object]:
    """HF ``generate()`` of exactly ``n`` greedy tokens with a static cache."""
    ids = torch.tensor(prompts, device="cuda")
    mask = torch.ones_like(ids)

    def go() -> object:
        with torch.inference_mode():
            return hf.generate(  # type: ignore[operator]
                ids,
                attention_mask=mask,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
                cache_implementation="static",
            )

    return go


def ours_generate(llm: LLM, prompts: list[list[int]], n: int) -> Callable[[], object]:
    """Our ``LLM.generate()`` of exactly ``n`` greedy tokens."""
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return lambda: llm.generate(prompt_token_ids=prompts, sampling_params=params)


def staging_gbps(llm: LLM, repeats: int, num_bytes: int = 1 << 30) -> dict[str, float]:
    """Export/import GB/s of ~``num_bytes`` of blocks through the engine's host mirror."""
    storage = llm.engine.parts.storage
    block_bytes = storage.layout.block_bytes
    count = min((storage.num_blocks - 1) // 2, num_bytes // block_bytes)
    contiguous = list(range(1, count + 1))
    scattered = list(range(1, storage.num_blocks, 2))[:count]  # every other block: 1-block runs

    def export(ids: list[int]) -> Callable[[], None]:
        def go() -> None:
            storage.stage_to_host(ids)
            for block_id in ids:  # what the transfer layer's readers wait for
                storage.staging.wait_host(block_id)

        return go

    def import_(ids: list[int]) -> Callable[[], None]:
        def go() -> None:
            storage.stage_to_device(ids)
            storage.fence_uploads()

        return go

    runs = {
        "export_d2h": export(contiguous),
        "export_d2h_scattered": export(scattered),
        "import_h2d": import_(contiguous),
        "import_h2d_scattered": import_(scattered),
    }
    best = paired_best(repeats, runs)
    return {name: count * block_bytes / seconds / 1e9 for name, seconds in best.items()}


def host_waits_per_step(llm: LLM, vocab: int) -> float:
    """Host waits for the device per engine step, over a batch-8 run of 64 new tokens each."""
    engine = llm.engine
    real_step = engine.step
    steps = [0]

    def counted() -> list:  # type: ignore[type-arg]
        steps[0] += 1
        return real_step()

    engine.step = counted  # type: ignore[method-assign]
    before = engine.reader.num_waits
    try:
        ours_generate(llm, random_prompts(WAIT_BATCH, PROMPT_LEN, vocab, seed=4), WAIT_TOKENS)()
    finally:
        del engine.step
    return (engine.reader.num_waits - before) / max(steps[0], 1)


def sync_free_decode_steps(llm: LLM, vocab: int, num_steps: int = 16) -> bool:
    """Whether steady decode steps run with every host wait for the device forbidden but the
    reader's own (``DeviceReader.forbid_other_syncs``)."""
    engine = llm.engine
    params = SamplingParams(max_tokens=num_steps + 8, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(random_prompts(4, 128, vocab, seed=5)):
        engine.add_request(f"sync-check-{i}", prompt, params)
    for _ in range(4):  # prefill and the first decodes, outside the check
        engine.step()
    try:
        with engine.reader.forbid_other_syncs():
            for _ in range(num_steps):
                engine.step()
        return True
    except RuntimeError as e:
        logger.warning("a decode step synchronised: %s", e)
        return False
    finally:
        while engine.has_unfinished():
            engine.step()


def progress(result: dict[str, object]) -> None:
    """Log the figures so far (a run stopped by a time limit still leaves them)."""
    logger.info("so far: %s", json.dumps(result, default=str))


def meets(value: float, op: str, target: float) -> bool:
    """``value op target`` for ``op`` in ``<=`` / ``>=``."""
    return value <= target if op == "<=" else value >= target


def leading_match(a: list[int], b: list[int]) -> int:
    """How many leading tokens two sequences share."""
    same = [x == y for x, y in zip(a, b, strict=False)]
    return same.index(False) if False in same else len(same)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:llama-1b")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-gib", type=float, default=8.0, help="our engine's KV budget")
    parser.add_argument("--compile", action="store_true", help="our engine with compile_model")
    parser.add_argument("--hf-compile", action="store_true", help="torch.compile HF's forward")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu_engine.py needs a CUDA GPU: torch.cuda.is_available() is False")
    from decode_attention_timing import decode_attention_us  # a sibling script
    from transformers import AutoModelForCausalLM

    model_dir = resolve_model(args.model)  # writes a built-in on first use
    build_s: dict[str, float] = {}

    def build(overlap: Literal["on", "off"]) -> LLM:
        start = time.perf_counter()
        built = LLM(
            args.model,
            dtype="bfloat16",
            max_model_len=PREFILL_LEN + 16,
            max_num_seqs=BATCH,
            max_num_batched_tokens=PREFILL_LEN,
            enable_prefix_caching=False,  # HF has none, and the loops repeat their prompts
            kv_cache_memory_bytes=int(args.kv_gib * 2**30),
            compile_model=args.compile,
            async_scheduling=overlap,
        )
        build_s[overlap] = time.perf_counter() - start
        return built

    llm, llm_sync = build("on"), build("off")
    parts = llm.engine.parts
    hf: torch.nn.Module = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
    hf = hf.cuda().eval()
    if args.hf_compile:
        hf.forward = torch.compile(hf.forward, mode="reduce-overhead", fullgraph=True)
    vocab = parts.arch.vocab_size
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "model": args.model,
        "parameters": sum(p.numel() for p in parts.model.parameters()),
        "dtype": "bfloat16",
        "compile_model": args.compile,
        "hf_compile": args.hf_compile,
        "cuda_graph_batch_sizes": list(parts.cuda_graph_batch_sizes),
        "async_scheduling": llm.engine.async_scheduling,
        "engine_build_s": build_s["on"],
    }
    off: dict[str, float] = {"engine_build_s": build_s["off"]}
    logger.info("measuring copy bandwidth and matmul rate")
    copy_bw = copy_bandwidth_gbps()
    peak_tflops = matmul_tflops()

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
            "off1": ours_generate(llm_sync, one, 1),
            "offn": ours_generate(llm_sync, one, NEW_TOKENS),
        },
    )
    hf_tpot = (t["hfn"] - t["hf1"]) / (NEW_TOKENS - 1)
    us_tpot = (t["usn"] - t["us1"]) / (NEW_TOKENS - 1)
    off_tpot = (t["offn"] - t["off1"]) / (NEW_TOKENS - 1)
    result["tpot_b1_ms"] = us_tpot * 1e3
    result["hf_tpot_b1_ms"] = hf_tpot * 1e3
    result["tpot_b1_ratio"] = us_tpot / hf_tpot
    off["tpot_b1_ms"] = off_tpot * 1e3
    ours_tokens = list(ours_generate(llm, one, NEW_TOKENS)()[0].token_ids)  # type: ignore[index]
    hf_tokens = hf_generate(hf, one, NEW_TOKENS)()[0, PROMPT_LEN:].tolist()  # type: ignore[index]
    result["greedy_match_b1_tokens"] = leading_match(ours_tokens, hf_tokens)

    step_bytes = decode_bytes_per_step(
        parts.model, parts.layout.bytes_per_token, PROMPT_LEN + NEW_TOKENS / 2
    )
    result["copy_bandwidth_gbps"] = copy_bw
    result["decode_bytes_per_step_b1"] = step_bytes
    result["roofline_tpot_b1_ms"] = step_bytes / (copy_bw * 1e9) * 1e3
    result["bandwidth_utilisation_b1"] = step_bytes / us_tpot / 1e9 / copy_bw
    off["bandwidth_utilisation_b1"] = step_bytes / off_tpot / 1e9 / copy_bw

    logger.info("host waits per step, and decode steps under sync debug mode")
    result["host_waits_per_step"] = host_waits_per_step(llm, vocab)
    off["host_waits_per_step"] = host_waits_per_step(llm_sync, vocab)
    result["sync_free_decode_step"] = sync_free_decode_steps(llm, vocab)
    result["async_off"] = off

    progress(result)
    logger.info("decode attention: one layer, batch 1, 640-token context")
    result["decode_attention_us_b1"] = decode_attention_us("cuda")
    result["decode_attention_us_b1_single_pass"] = decode_attention_us("cuda", num_splits=1)

    progress(result)
    logger.info("prefill: one %d-token prompt", PREFILL_LEN)
    long_prompt = random_prompts(1, PREFILL_LEN, vocab, seed=3)
    t = paired_best(args.repeats, {"us": ours_generate(llm, long_prompt, 1)})
    achieved = prefill_flops(parts.model, PREFILL_LEN) / t["us"] / 1e12
    result["prefill_tokens_per_s"] = PREFILL_LEN / t["us"]
    result["prefill_tflops"] = achieved
    result["matmul_tflops"] = peak_tflops
    result["prefill_tflops_ratio"] = achieved / peak_tflops

    logger.info("KV staging through the pinned host mirror")
    result["staging_gbps"] = staging_gbps(llm, args.repeats)

    progress(result)
    logger.info("batch %d: %d-token prompts, %d new tokens", BATCH, PROMPT_LEN, NEW_TOKENS)
    many = random_prompts(BATCH, PROMPT_LEN, vocab, seed=2)
    t = paired_best(
        args.repeats,
        {
            "hf": hf_generate(hf, many, NEW_TOKENS),
            "us": ours_generate(llm, many, NEW_TOKENS),
            "off": ours_generate(llm_sync, many, NEW_TOKENS),
        },
    )
    tokens = BATCH * NEW_TOKENS
    result["throughput_b64_tok_s"] = {"ours": tokens / t["us"], "hf": tokens / t["hf"]}
    result["throughput_b64_ratio"] = t["hf"] / t["us"]
    off["throughput_b64_tok_s"] = tokens / t["off"]
    off["throughput_b64_ratio"] = t["hf"] / t["off"]
    result["async_off"] = off

    result["targets"] = {k: f"{op} {v}" for k, (op, v) in TARGETS.items()}
    result["met"] = {k: meets(float(result[k]), *TARGETS[k]) for k in TARGETS}  # type: ignore[arg-type]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
