"""A leaving decode replica's stream handed off with its KV, against recomputing it, in one run.

Two engines of the same model (each a decode replica's: no host tier), one process. The holder
decodes a long-context greedy request; after ``--generated`` tokens it is asked to leave
(``DecodeWorker.hand_off``): the request's computed blocks are exported over the real gRPC KV
transfer (loopback, ``same_node: off``: the bytes go over the wire) and the stream ends with the
export. The continuation then runs on the other engine twice, from an empty prefix cache each
time:

- **pulled**: pull the exported blocks (``PrefixCopies.pull_handed_off``) into the device
  prefix cache, then the local prefill of prompt + tokens so far, which computes only the last
  partial block;
- **recompute** (the peer, what a cut stream costs): the same local prefill with nothing cached.

Each continuation's time to its first token counts from the moment the holder's stream ended
(the pull included). Both continuations must give the tokens an uninterrupted run gives.
Prints a line per repeat and one JSON object last: ``continuation_ttft_pulled_ms``,
``continuation_ttft_recompute_ms`` (medians), ``pulled_over_recompute``, ``blocks_pulled``,
``pull_ms`` and ``tokens_identical``.

Usage: ``PYTHONPATH=. python benchmarks/decode_handoff.py [--model builtin:smollm2-135m-instruct]
[--prompt-tokens 1536] [--generated 64] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass

from core.config import EngineConfig, ModelConfig, TransferConfig
from core.ids import new_request_id
from core.messages import DecodeRequest, PrefixExport, TokenChunk
from core.sampling import SamplingParams
from decode.worker import DecodeWorker
from engine.async_engine import AsyncEngine
from engine.engine_builder import build_async_engine
from replica.prefix_copies import PrefixCopies
from replica.prefix_export import PrefixExporter
from transfer import GrpcKVTransport
from transfer.block_store import BlockStore

TRANSFER = TransferConfig(
    bind_host="127.0.0.1",
    insecure_test_token="benchmark-only-token",
    same_node="off",
    pull_deadline_s=60.0,
)


@dataclass(frozen=True)
class Repeat:
    """One handoff and its two continuations."""

    blocks_pulled: int
    pull_s: float
    pulled_ttft_s: float
    recompute_ttft_s: float
    identical: bool


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


async def first_token_and_all(
    worker: DecodeWorker, request: DecodeRequest, started_s: float
) -> tuple[float, list[int]]:
    """Seconds from ``started_s`` to the first token, and every token of the stream."""
    first_s: float | None = None
    tokens: list[int] = []
    async for chunk in worker.generate(request):
        if chunk.error is not None:
            raise RuntimeError(f"{request.request_id}: {chunk.error}")
        if chunk.token_ids and first_s is None:
            first_s = time.perf_counter() - started_s
        tokens.extend(chunk.token_ids)
    assert first_s is not None, f"{request.request_id} produced no token"
    return first_s, tokens


async def handed_off(
    holder: DecodeWorker, exporter: PrefixExporter, prompt: list[int], total: int, after: int
) -> tuple[list[int], PrefixExport]:
    """Decode on the holder, hand off after ``after`` tokens: the tokens sent, the export."""
    chunks: list[TokenChunk] = []
    leaving: asyncio.Task[int] | None = None
    async for chunk in holder.generate(DecodeRequest(new_request_id(), prompt, greedy(total))):
        chunks.append(chunk)
        if leaving is None and sum(len(c.token_ids) for c in chunks) >= after:
            leaving = asyncio.create_task(holder.hand_off(exporter))
    assert leaving is not None and await leaving == 1, "the stream was not handed off"
    export = chunks[-1].handoff
    assert export is not None, "the handoff exported no block"
    return [t for c in chunks for t in c.token_ids], export


async def reset(engine: AsyncEngine) -> None:
    await engine.call(lambda e: e.scheduler.reset_prefix_cache())


async def run(args: argparse.Namespace) -> dict[str, object]:
    engine_config = EngineConfig(
        max_model_len=args.prompt_tokens + args.generated + args.continued + 64,
        kv_cache_memory_bytes=args.kv_bytes,
    )
    model = ModelConfig(name=args.model)
    holder_engine = build_async_engine(model, engine_config)
    target_engine = build_async_engine(model, engine_config)
    # each worker's import transport (unused: every request here is a local prefill), and the
    # holder's serving one its handoffs leave through
    transports = [
        GrpcKVTransport(holder_engine.engine.parts.storage, TRANSFER, serve=False),
        GrpcKVTransport(target_engine.engine.parts.storage, TRANSFER, serve=False),
        GrpcKVTransport(holder_engine.engine.parts.storage, TRANSFER, serve=True),
    ]

    def pull_transport(store: BlockStore) -> GrpcKVTransport:
        return GrpcKVTransport(store, TRANSFER, serve=False)

    holder = DecodeWorker(holder_engine, transports[0])
    target = DecodeWorker(target_engine, transports[1])
    exporter = PrefixExporter(holder_engine, transports[2])
    copies = PrefixCopies("target", "decode", target_engine, transports[1], pull_transport,
                          pull_timeout_s=60.0)  # fmt: skip
    vocab = holder_engine.engine.parts.arch.vocab_size
    total = args.generated + args.continued
    repeats: list[Repeat] = []
    try:
        for index in range(args.repeats):
            rng = random.Random(args.seed + index)
            prompt = [rng.randrange(10, vocab - 10) for _ in range(args.prompt_tokens)]
            whole = DecodeRequest(new_request_id(), prompt, greedy(total))
            _, reference = await first_token_and_all(target, whole, time.perf_counter())
            await reset(target_engine)
            sent, export = await handed_off(holder, exporter, prompt, total, args.generated)
            owed = greedy(total - len(sent))
            ended_s = time.perf_counter()
            pulled = await copies.pull_handed_off(export)
            pull_s = time.perf_counter() - ended_s
            continuation = DecodeRequest(new_request_id(), prompt + sent, owed)
            pulled_ttft, via_pull = await first_token_and_all(target, continuation, ended_s)
            await reset(target_engine)
            again = DecodeRequest(new_request_id(), prompt + sent, owed)
            recompute_ttft, via_recompute = await first_token_and_all(
                target, again, time.perf_counter()
            )
            await reset(target_engine)
            identical = sent + via_pull == reference == sent + via_recompute
            repeat = Repeat(pulled.num_blocks_admitted, pull_s, pulled_ttft, recompute_ttft,
                            identical)  # fmt: skip
            repeats.append(repeat)
            print(
                f"repeat {index}: {len(prompt)} prompt + {len(sent)} generated tokens, "
                f"{repeat.blocks_pulled} blocks pulled in {1000 * pull_s:.0f} ms; continuation "
                f"TTFT pulled {1000 * pulled_ttft:.0f} ms, recomputed "
                f"{1000 * recompute_ttft:.0f} ms; identical: {identical}",
                flush=True,
            )
    finally:
        for transport in transports:
            transport.close()
        holder_engine.shutdown()
        target_engine.shutdown()
    pulled_ms = 1000 * statistics.median(r.pulled_ttft_s for r in repeats)
    recompute_ms = 1000 * statistics.median(r.recompute_ttft_s for r in repeats)
    return {
        "model": args.model,
        "prompt_tokens": args.prompt_tokens,
        "generated_before_handoff": args.generated,
        "continuation_ttft_pulled_ms": round(pulled_ms, 1),
        "continuation_ttft_recompute_ms": round(recompute_ms, 1),
        "pulled_over_recompute": round(pulled_ms / recompute_ms, 3),
        "blocks_pulled": min(r.blocks_pulled for r in repeats),
        "pull_ms": round(1000 * statistics.median(r.pull_s for r in repeats), 1),
        "tokens_identical": all(r.identical for r in repeats),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="builtin:smollm2-135m-instruct", help="Model name.")
    p.add_argument("--prompt-tokens", type=int, default=1536, help="Prompt length.")
    p.add_argument("--generated", type=int, default=64, help="Tokens before the handoff.")
    p.add_argument("--continued", type=int, default=8, help="Tokens after it.")
    p.add_argument("--kv-bytes", type=int, default=512 << 20, help="Each engine's KV cache.")
    p.add_argument("--repeats", type=int, default=3, help="Handoffs measured.")
    p.add_argument("--seed", type=int, default=7, help="Prompt seed.")
    args = p.parse_args(argv)
    result = asyncio.run(run(args))
    print(json.dumps(result))
    return 0 if result["tokens_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
