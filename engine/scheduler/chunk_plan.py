"""Recorded prompt chunks: compute a recomputed prompt in the chunks its prefill used.

Greedy output can depend on how a prompt's prefill was chunked: the attention and matmul
reductions of a 256-token chunk and of a 512-token one round differently, and once in a few
hundred prompts that flips an argmax. So "a decode replica that recomputes the prompt after a
failed transfer produces the same tokens" holds only when it chunks as the prefill replica did.
The prefill replica records where each prompt chunk ended (:func:`record_chunk`; a prefix-cache
hit's end counts as a boundary too); the handoff carries the positions; the recomputing
scheduler sizes each chunk to end exactly at the next recorded position (:func:`recorded_span`)
and trims a local prefix-cache hit back to a recorded boundary (:func:`recorded_hit`).
"""

from __future__ import annotations

from engine.kv.kv_cache_manager import ComputedBlocks
from engine.request import Request


def record_chunk(request: Request, start: int, end: int) -> None:
    """A prompt chunk ``[start, end)`` was computed; remember its end (and a hit's end)."""
    ends = request.prompt_chunk_ends
    if not ends and start > 0:
        ends.append(start)  # the prefix-cache hit ended here
    ends.append(min(end, request.num_prompt_tokens))


def recorded_span(request: Request, start: int) -> int | None:
    """Tokens from ``start`` to the next recorded chunk end, or None when the request follows
    no recorded plan (or is past its last recorded end)."""
    for end in request.follow_chunk_ends:
        if end > start:
            return end - start
    return None


def recorded_hit(request: Request, computed: ComputedBlocks, block_size: int) -> ComputedBlocks:
    """A local prefix-cache hit trimmed to the last whole block that is a recorded boundary, so
    the chunks after it line up with the recorded ones (no trim without a recorded plan)."""
    ends = request.follow_chunk_ends
    if not ends or not computed.block_ids:
        return computed
    aligned = [e for e in ends if e <= computed.num_tokens and e % block_size == 0]
    keep = max(aligned, default=0) // block_size
    return ComputedBlocks(block_ids=computed.block_ids[:keep], num_tokens=keep * block_size)
