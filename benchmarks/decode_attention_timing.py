"""GPU time of one layer's paged decode attention (the Triton kernel alone, no KV write).

:func:`decode_attention_us` builds a random paged batch — every sequence at ``context_tokens``,
its blocks shuffled through the cache — captures ``CALLS_PER_GRAPH`` back-to-back decode calls in
one CUDA graph (as the engine replays its decode steps, so host launch cost is not counted) and
times replays of it with CUDA events.

Run directly, it prints one JSON line: the single-pass kernel (``num_splits=1``) against the
split-KV kernel with its chosen split count, at the llama-1b layer shape (32 q heads, 8 kv heads,
head_dim 64, block 16) and batch 1, 640 tokens of context unless told otherwise.
Usage: ``python benchmarks/decode_attention_timing.py [--batch N] [--context-tokens N]``.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from engine.attention.triton_kernels.decode import paged_decode_attention
from engine.attention.triton_kernels.splits import choose_num_splits, sm_count

CALLS_PER_GRAPH = 20
WARMUP_REPLAYS = 3
LLAMA_1B_KV_HEADS = 8  # the default layer shape's kv heads (32 q heads, head_dim 64)


def decode_attention_us(
    device: torch.device | str,
    *,
    batch: int = 1,
    context_tokens: int = 640,
    num_heads: int = 32,
    num_kv_heads: int = 8,
    head_dim: int = 64,
    block_size: int = 16,
    dtype: torch.dtype = torch.bfloat16,
    repeats: int = 50,
    num_splits: int | None = None,
    block_n: int = 64,
) -> float:
    """Mean microseconds of one ``paged_decode_attention`` call on CUDA ``device``, over
    ``repeats`` replays of a graph of :data:`CALLS_PER_GRAPH` calls (``num_splits=None``: the
    kernel's own choice for this batch)."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"decode attention timing needs a CUDA device, got {device}")
    gen = torch.Generator(device=device).manual_seed(0)
    blocks_per_seq = -(-context_tokens // block_size)
    num_blocks = batch * blocks_per_seq
    kv_cache = torch.randn(
        num_blocks, 2, block_size, num_kv_heads, head_dim, generator=gen, device=device
    ).to(dtype)  # [num_blocks, 2, block_size, Hkv, D]
    block_tables = (
        torch.randperm(num_blocks, generator=gen, device=device)
        .view(batch, blocks_per_seq)
        .to(torch.int32)
    )  # [B, blocks_per_seq]
    seq_lens = torch.full((batch,), context_tokens, dtype=torch.int32, device=device)  # [B]
    q = torch.randn(batch, num_heads, head_dim, generator=gen, device=device).to(dtype)
    out = torch.empty_like(q)  # [B, H, D]
    scale = head_dim**-0.5

    def call() -> None:
        paged_decode_attention(
            out,
            q,
            kv_cache,
            block_tables,
            seq_lens,
            scale,
            block_n=block_n,
            num_splits=num_splits,
        )

    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        call()  # compiles the kernels outside the capture
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            call()
    for _ in range(WARMUP_REPLAYS):
        graph.replay()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / (repeats * CALLS_PER_GRAPH)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context-tokens", type=int, default=640)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit(
            "benchmarks/decode_attention_timing.py needs a CUDA GPU: "
            "torch.cuda.is_available() is False"
        )
    device = torch.device("cuda")
    shape = {"batch": args.batch, "context_tokens": args.context_tokens}
    result = {
        **shape,
        "num_splits": choose_num_splits(args.batch, LLAMA_1B_KV_HEADS, sm_count(device)),
        "single_pass_us": round(decode_attention_us(device, num_splits=1, **shape), 2),
        "split_kv_us": round(decode_attention_us(device, **shape), 2),
        "device": torch.cuda.get_device_name(device),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
