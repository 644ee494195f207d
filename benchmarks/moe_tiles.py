"""Tune the MoE grouped GEMM's tile table on a GPU: time every candidate tile per batch shape.

For each number of tokens (decode at batch 1 and 64, a prefill chunk), random bf16 experts of a
model's MoE shape and random top-k routing go through
:func:`~engine.models.triton_kernels.fused_moe.fused_moe_experts` with each candidate
:class:`~engine.models.triton_kernels.moe_config.MoEGemmConfig`, captured in a CUDA graph (as the
decode step runs it) and timed over replays with CUDA events. Each shape reports the table's
current choice, the fastest candidate, and the bandwidth the fastest reaches over the bytes of
the experts it must read (decode is bound by streaming the active experts' weights).

Progress goes to stderr; the last stdout line is one JSON object: ``shapes`` (per token count:
``rows_per_expert``, ``table_us``, ``best_us``, ``best`` config, ``best_weight_gbps``, the five
fastest), ``device``. ``--deadline-s`` bounds the whole sweep (candidates left untimed are
reported as ``skipped``). Needs CUDA.

Usage: ``python benchmarks/moe_tiles.py [--experts 64 --top-k 8 --hidden 2048 --inter 768]
[--tokens 1,64,4096] [--deadline-s 120]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict

import torch
from triton.runtime.errors import OutOfResources

from engine.models.triton_kernels.fused_moe import fused_moe_experts
from engine.models.triton_kernels.moe_config import MoEGemmConfig, moe_gemm_config

logger = logging.getLogger("moe_tiles")

DECODE_CANDIDATES = [
    MoEGemmConfig(m, n, k, num_warps=w, num_stages=s)
    for m, n, k, w, s in itertools.product((16,), (32, 64, 128), (128, 256), (4, 8), (3, 4))
]
MEDIUM_CANDIDATES = [
    MoEGemmConfig(m, n, k, num_warps=w, num_stages=s)
    for m, n, k, w, s in itertools.product((16, 32), (64, 128), (64, 128), (4,), (3, 4))
]
PREFILL_CANDIDATES = [
    MoEGemmConfig(m, n, k, num_warps=w, num_stages=s)
    for m, n, k, w, s in itertools.product((64, 128), (128, 256), (64,), (4, 8), (3, 4))
]


def candidates_for(rows_per_expert: float) -> list[MoEGemmConfig]:
    """The candidates worth timing at this many rows per expert."""
    if rows_per_expert <= 8:
        return DECODE_CANDIDATES
    if rows_per_expert <= 64:
        return MEDIUM_CANDIDATES
    return PREFILL_CANDIDATES


def graph_us(fn: Callable[[], object], replays: int = 50) -> float:
    """Mean microseconds of one replay of ``fn`` captured in a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # compile and warm up outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / replays


def sweep_shape(num_tokens: int, args: argparse.Namespace, deadline: float) -> dict[str, object]:
    """Time the table's config and every candidate for ``num_tokens`` tokens."""
    gen = torch.Generator(device="cuda").manual_seed(num_tokens)
    dtype = torch.bfloat16
    hidden = torch.randn(num_tokens, args.hidden, device="cuda", generator=gen).to(dtype)
    gate_up = (
        torch.randn(args.experts, 2 * args.inter, args.hidden, device="cuda", generator=gen) * 0.02
    ).to(dtype)
    down = (
        torch.randn(args.experts, args.hidden, args.inter, device="cuda", generator=gen) * 0.02
    ).to(dtype)
    scores = torch.rand(num_tokens, args.experts, device="cuda", generator=gen)
    local_ids = scores.topk(args.top_k, dim=-1).indices.reshape(-1)  # [N] int64
    weights = torch.full((local_ids.numel(),), 1.0 / args.top_k, device="cuda")
    num_rows = local_ids.numel()
    rows_per_expert = num_rows / args.experts
    active = int(torch.unique(local_ids).numel())
    weight_bytes = active * (gate_up[0].numel() + down[0].numel()) * gate_up.element_size()

    def run_with(config: MoEGemmConfig | None) -> float:
        return graph_us(
            lambda: fused_moe_experts(
                hidden, local_ids, args.top_k, gate_up, down, None, None, weights, config
            )
        )

    table_config = moe_gemm_config(num_rows, args.experts, dtype, interpreted=False)
    table_us = run_with(None)
    timed: list[tuple[float, MoEGemmConfig]] = []
    skipped = 0
    for config in candidates_for(rows_per_expert):
        if time.monotonic() > deadline:
            skipped += 1
            continue
        try:
            timed.append((run_with(config), config))
        except OutOfResources as e:  # a tile that does not fit in shared memory
            logger.info("  %s: %s", config, type(e).__name__)
    timed.sort(key=lambda t: t[0])
    best_us, best = timed[0] if timed else (table_us, table_config)
    logger.info(
        "%d tokens (%.2f rows/expert): table %.1f us, best %.1f us %s",
        num_tokens,
        rows_per_expert,
        table_us,
        best_us,
        best,
    )
    return {
        "tokens": num_tokens,
        "rows_per_expert": rows_per_expert,
        "active_experts": active,
        "table": asdict(table_config),
        "table_us": table_us,
        "best_us": best_us,
        "best": asdict(best),
        "best_weight_gbps": weight_bytes / (best_us * 1e-6) / 1e9,
        "table_weight_gbps": weight_bytes / (table_us * 1e-6) / 1e9,
        "fastest": [{"us": us, **asdict(cfg)} for us, cfg in timed[:5]],
        "timed": len(timed),
        "skipped": skipped,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--inter", type=int, default=768)
    parser.add_argument("--tokens", default="1,64,4096")
    parser.add_argument("--deadline-s", type=float, default=120.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    if not torch.cuda.is_available():
        sys.exit("benchmarks/moe_tiles.py needs a CUDA GPU: torch.cuda.is_available() is False")
    token_counts = [int(t) for t in args.tokens.split(",")]
    start = time.monotonic()
    shapes = []
    for i, num_tokens in enumerate(token_counts):
        # each shape gets an equal share of what is left of the deadline
        share = (args.deadline_s - (time.monotonic() - start)) / (len(token_counts) - i)
        with torch.inference_mode():
            shapes.append(sweep_shape(num_tokens, args, time.monotonic() + share))
    print(json.dumps({"device": torch.cuda.get_device_name(), "shapes": shapes}))


if __name__ == "__main__":
    main()
