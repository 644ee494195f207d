"""Tensor parallelism on the CPU: a TP=2 gang against one rank, same model, same cores.

Two engines of the same checkpoint (default ``builtin:llama-1b``, float32 on the CPU: 1.1B
parameters, where the matmuls dominate a step): ``LLM(model)`` with every core, and
``LLM(model, tensor_parallel_size=2)`` (rank 0 here, rank 1 a follower process; one core each).
Each round, interleaved, times on both: a prefill (one new token after ``--prompt-tokens`` random
tokens; prefix caching off) and a decode (``--new-tokens`` greedy tokens after the same prompt),
and checks that both decode the same tokens. Progress goes to stderr; the last stdout line is one
JSON object:

- ``tp2_decode_tpot_ratio``: TP=2 time per output token over one rank's (target <= 1.3: on two
  shared cores TP buys no speed, the figure is what the collectives and the step broadcast cost);
- ``tp2_prefill_throughput_ratio``: TP=2 prefill tokens/s over one rank's;
- ``tp2_output_identical``: greedy tokens equal in every round;
- the times behind them (``tpot_ms``, ``prefill_tok_s`` per engine), best of ``--repeats``.

Then P/D between pools of different TP sizes, through the real prefill and decode workers over
gRPC (``transfer.same_node: off``: every byte crosses a socket), on the same prompt: a TP=1
prefill into a TP=1 decode (the peer), a TP=2 prefill into a TP=1 decode and a TP=1 prefill into
a TP=2 decode (one gang per process, so each pair is built after the last is shut down):

- ``hetero_pd_bytes_ratio``: KV bytes the TP=2 -> TP=1 pull moved over the TP=1 -> TP=1 pull's
  (target == 1.0: each decode rank pulls exactly its heads, each head once);
  ``hetero_pd_bytes_ratio_tp1_to_tp2`` the same for the other direction;
- ``hetero_pd_output_identical``: both handoffs' greedy tokens equal the colocated one-rank run.

Usage: ``python benchmarks/tensor_parallel.py [--model builtin:llama-1b] [--prompt-tokens 256]
[--new-tokens 16] [--repeats 2]``
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import random
import sys
import time
from typing import Any

import torch

from core.sampling import SamplingParams
from engine import LLM

logger = logging.getLogger("tensor_parallel")

HANDOFF_TOKENS = 8
"""Greedy tokens each P/D handoff decodes (the first from the prefill)."""


def timed(llm: LLM, prompt: list[int], new_tokens: int, threads: int) -> tuple[float, list[int]]:
    """Seconds to generate ``new_tokens`` greedy tokens after ``prompt``, and the tokens."""
    torch.set_num_threads(threads)
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    [out] = llm.generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)
    return time.perf_counter() - start, list(out.outputs[0].token_ids)


def handoff_bytes(
    model: str, options: dict[str, Any], prefill_tp: int, decode_tp: int, prompt: list[int]
) -> tuple[int, list[int], float]:
    """One prefill -> decode handoff of ``prompt`` between pools of these TP sizes: KV bytes the
    decode pulled, the greedy tokens, and the pull's seconds."""
    import asyncio

    from core.config import EngineConfig, ModelConfig, TransferConfig
    from core.messages import DecodeRequest, PrefillRequest
    from decode.build import build_decode_worker
    from prefill.build import build_prefill_worker

    model_cfg = ModelConfig(name=model, dtype="float32")
    transfer = TransferConfig(
        bind_host="127.0.0.1", insecure_test_token="tp-bench", same_node="off"
    )
    engine = {k: v for k, v in options.items() if k != "dtype"}
    prefill = build_prefill_worker(
        model_cfg, EngineConfig(**engine, tensor_parallel_size=prefill_tp), transfer
    )
    decode = build_decode_worker(
        model_cfg, EngineConfig(**engine, tensor_parallel_size=decode_tp), transfer
    )
    params = SamplingParams(max_tokens=HANDOFF_TOKENS, temperature=0.0, ignore_eos=True)

    async def run() -> list[int]:
        result = await prefill.prefill(PrefillRequest("bench", prompt, params))
        request = DecodeRequest(
            "bench",
            prompt,
            params,
            first_token_id=result.first_token_id,
            kv_handle=result.kv_handle,
            prompt_chunk_ends=result.prompt_chunk_ends,
        )
        tokens = [result.first_token_id]
        async for chunk in decode.generate(request):
            tokens += chunk.token_ids
        return tokens

    try:
        tokens = asyncio.run(run())
        stats = decode.stats().transfer
        if stats.failures_total or stats.transfers_total != 1:
            raise RuntimeError(f"the handoff did not pull its KV once: {stats}")
        return stats.bytes_total, tokens, stats.seconds_total
    finally:
        asyncio.run(decode.shutdown())
        asyncio.run(prefill.shutdown())


def hetero_pd(
    model: str, options: dict[str, Any], prompt: list[int], reference: list[int]
) -> dict[str, object]:
    """The heterogeneous P/D keys: bytes ratios against TP=1 -> TP=1, and output identity
    against ``reference`` (the colocated one-rank run's greedy tokens)."""
    runs = {pair: handoff_bytes(model, options, *pair, prompt) for pair in ((1, 1), (2, 1), (1, 2))}
    for (p, d), (moved, _, seconds) in runs.items():
        logger.info("prefill TP=%d -> decode TP=%d: %d bytes in %.3f s", p, d, moved, seconds)
    baseline = runs[(1, 1)][0]
    return {
        "hetero_pd_bytes": {f"tp{p}_to_tp{d}": run[0] for (p, d), run in runs.items()},
        "hetero_pd_pull_s": {f"tp{p}_to_tp{d}": run[2] for (p, d), run in runs.items()},
        "hetero_pd_bytes_ratio": runs[(2, 1)][0] / baseline,
        "hetero_pd_bytes_ratio_tp1_to_tp2": runs[(1, 2)][0] / baseline,
        "hetero_pd_output_identical": all(run[1] == reference for run in runs.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:llama-1b")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    cores = os.cpu_count() or 2
    options = {
        "dtype": "float32",
        "max_model_len": args.prompt_tokens + args.new_tokens + 16,
        "enable_prefix_caching": False,  # every round computes its whole prompt
        "kv_cache_memory_bytes": 256 << 20,
        "max_num_batched_tokens": max(2048, args.prompt_tokens),
    }
    logger.info("one rank: %s on %d cores", args.model, cores)
    one = LLM(args.model, **options)
    # NOTE: read by both ranks' build (core.env): one core per rank
    os.environ["PDSERVE_NUM_THREADS"] = str(max(1, cores // 2))
    logger.info("tensor_parallel_size=2: one core per rank")
    two = LLM(args.model, tensor_parallel_size=2, **options)
    vocab = one.engine.parts.arch.vocab_size
    rng = random.Random(0)
    best: dict[str, float] = {}
    identical = True
    reference: list[int] = []
    try:
        for round_ in range(args.repeats + 1):  # the first round warms up
            prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_tokens)]
            for name, llm, threads in (("tp1", one, cores), ("tp2", two, max(1, cores // 2))):
                prefill_s, _ = timed(llm, prompt, 1, threads)
                decode_s, tokens = timed(llm, prompt, args.new_tokens, threads)
                tpot = (decode_s - prefill_s) / (args.new_tokens - 1)
                if round_ == 0:
                    continue
                best[f"{name}_prefill_s"] = min(best.get(f"{name}_prefill_s", 1e9), prefill_s)
                best[f"{name}_tpot_s"] = min(best.get(f"{name}_tpot_s", 1e9), tpot)
                if name == "tp1":
                    reference = tokens
                else:
                    identical = identical and tokens == reference
                logger.info(
                    "round %d %s: prefill %.2f s, TPOT %.1f ms", round_, name, prefill_s, tpot * 1e3
                )
    finally:
        two.shutdown()
    os.environ.pop("PDSERVE_NUM_THREADS")
    _, colocated = timed(one, prompt, HANDOFF_TOKENS, cores)
    del one  # the handoffs below hold up to three copies of the weights at once
    gc.collect()
    hetero = hetero_pd(args.model, options, prompt, colocated)
    result = {
        "model": args.model,
        "cores": cores,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "tpot_ms": {"tp1": best["tp1_tpot_s"] * 1e3, "tp2": best["tp2_tpot_s"] * 1e3},
        "prefill_tok_s": {
            "tp1": args.prompt_tokens / best["tp1_prefill_s"],
            "tp2": args.prompt_tokens / best["tp2_prefill_s"],
        },
        "tp2_decode_tpot_ratio": best["tp2_tpot_s"] / best["tp1_tpot_s"],
        "tp2_prefill_throughput_ratio": best["tp1_prefill_s"] / best["tp2_prefill_s"],
        "tp2_output_identical": identical,
        **hetero,
        "targets": {
            "tp2_decode_tpot_ratio": "<= 1.3",
            "tp2_output_identical": "true",
            "hetero_pd_bytes_ratio": "== 1.0",
            "hetero_pd_output_identical": "true",
        },
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
