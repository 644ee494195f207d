"""KV tiers on against tiers off, in one run on the same cores and the same tiny Llama.

Workloads (offline engine, one request at a time so TTFT is the engine's own):

- **multi-turn chat**: ``--sessions`` sessions share a system prompt; each turn appends a user
  message and the previous answer; sessions take turns round-robin (the think time between a
  session's turns is everyone else's turns), so a session's KV has left the device pool by its
  next turn. The working set is about 4x the device KV and fits in the host tier. Served with
  tiers off, host, host+disk (small host tier spilling to disk) and disk only.
- **onload vs recompute**: the time to first token of a 2048-token prefix brought back from host
  and from disk, against computing it (all three compute the one token after the prefix).
- **no reuse**: distinct random prompts under device pressure; output tokens/s tiers on / off.

Prints a table, writes the hit-rate-per-tier plot (``--plot``), and prints one JSON object
last with ``ttft_p50_ratio``, ``hit_rate_ratio``, ``host_onload_ratio``, ``disk_onload_ratio``
and ``no_reuse_throughput_ratio``. Usage: ``python benchmarks/kv_tiers.py [--plot PATH]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from core.config import DiskTierConfig, HostTierConfig, KVTiersConfig
from core.sampling import SamplingParams
from engine.llm import LLM

MODEL = "builtin:tiny-llama"
BLOCK = 16


def _llm(device_blocks: int, block_bytes: int, tiers: KVTiersConfig | None) -> LLM:
    return LLM(
        MODEL,
        max_model_len=4096,
        kv_cache_memory_bytes=device_blocks * block_bytes,
        kv_tiers=tiers,
    )


def _first_token_s(
    llm: LLM, request_id: str, prompt: list[int], max_tokens: int
) -> tuple[float, list[int], int]:
    """TTFT, output tokens and cached prompt tokens of one request run alone."""
    engine = llm.engine
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    engine.add_request(request_id, prompt, params)
    ttft = None
    while True:
        for out in engine.step():
            if out.request_id != request_id:
                continue
            if ttft is None and out.outputs[0].token_ids:
                ttft = time.perf_counter() - start
            if out.finished:
                assert ttft is not None
                return ttft, list(out.outputs[0].token_ids), out.num_cached_tokens or 0


@dataclass(frozen=True)
class ChatResult:
    """One mode's multi-turn result: turn-2+ TTFT p50, prompt tokens hit, hits per tier."""

    ttft_p50_s: float
    hit_rate: float
    timeline: list[dict[str, int]]


def multi_turn(llm: LLM, args: argparse.Namespace) -> ChatResult:
    rng = random.Random(7)
    system = [rng.randrange(3, 250) for _ in range(args.system_tokens)]
    history = {s: list(system) for s in range(args.sessions)}
    ttfts, cached, prompt_tokens, timeline = [], 0, 0, []
    for turn in range(args.turns):
        for session in range(args.sessions):
            prompt = history[session] + [rng.randrange(3, 250) for _ in range(args.user_tokens)]
            ttft, answer, hit = _first_token_s(llm, f"s{session}-t{turn}", prompt, args.answer)
            history[session] = prompt + answer
            if turn > 0:
                ttfts.append(ttft)
            cached += hit
            prompt_tokens += len(prompt)
            tiers = {t.medium: t.hits_total for t in llm.engine.scheduler.tier_stats()}
            timeline.append(tiers)
    llm.engine.scheduler.check_integrity()
    return ChatResult(statistics.median(ttfts), cached / prompt_tokens, timeline)


def onload_vs_recompute(block_bytes: int, tmp: Path) -> dict[str, float]:
    rng = random.Random(11)
    prefix = [rng.randrange(3, 250) for _ in range(2048)]
    fillers = [[rng.randrange(3, 250) for _ in range(2048)] for _ in range(2)]
    result: dict[str, float] = {}
    configs = {
        "recompute": None,
        "host": KVTiersConfig(host=HostTierConfig(bytes=600 * block_bytes)),
        "disk": KVTiersConfig(
            disk=DiskTierConfig(path=str(tmp / "onload"), bytes=600 * block_bytes)
        ),
    }
    for name, tiers in configs.items():
        llm = _llm(140, block_bytes, tiers)
        best = float("inf")
        for attempt in range(3):
            _first_token_s(llm, f"p{attempt}", [*prefix, 1 + attempt], 1)
            for index, filler in enumerate(fillers):  # push the prefix off the device
                _first_token_s(llm, f"f{attempt}-{index}", [*filler, 2 + attempt], 1)
            ttft, _, hit = _first_token_s(llm, f"q{attempt}", [*prefix, 9 + attempt], 1)
            assert (hit >= 2048) == (tiers is not None), (name, hit)
            best = min(best, ttft)
        result[name] = best
        llm.engine.close()
    return result


def no_reuse(block_bytes: int, tiers: KVTiersConfig | None, count: int) -> float:
    rng = random.Random(13)
    llm = _llm(96, block_bytes, tiers)
    prompts = [[rng.randrange(3, 250) for _ in range(480)] for _ in range(count)]
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    seconds = time.perf_counter() - start
    llm.engine.close()
    return sum(len(o.outputs[0].token_ids) for o in outs) / seconds


def plot(timelines: dict[str, list[dict[str, int]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(timelines), figsize=(4 * len(timelines), 3.2), sharey=True)
    for ax, (name, timeline) in zip(axes, timelines.items(), strict=True):
        for medium in ("device", "host", "disk"):
            series = [point.get(medium, 0) for point in timeline]
            if any(series):
                ax.plot(range(1, len(series) + 1), series, label=medium)
        ax.set_title(f"tiers: {name}")
        ax.set_xlabel("requests served")
        ax.legend()
    axes[0].set_ylabel("prefix blocks hit (cumulative)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="pdserve-kv-tiers-") as tmp:  # removed after the run
        run(Path(tmp))


def run(tmp: Path) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--system-tokens", type=int, default=128)
    parser.add_argument("--user-tokens", type=int, default=64)
    parser.add_argument("--answer", type=int, default=64)
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args()
    block_bytes = _llm(8, 1 << 15, None).engine.parts.layout.block_bytes
    final_ctx = args.system_tokens + args.turns * (args.user_tokens + args.answer)
    working_set = (args.sessions * (final_ctx - args.system_tokens) + args.system_tokens) // BLOCK
    device = max(working_set // 4, final_ctx // BLOCK + 2)
    host = working_set + 32
    modes = {
        "off": None,
        "host": KVTiersConfig(host=HostTierConfig(bytes=host * block_bytes)),
        "host+disk": KVTiersConfig(
            host=HostTierConfig(bytes=device * block_bytes),
            disk=DiskTierConfig(path=str(tmp / "hd"), bytes=host * block_bytes),
        ),
        "disk": KVTiersConfig(disk=DiskTierConfig(path=str(tmp / "d"), bytes=host * block_bytes)),
    }
    chat: dict[str, ChatResult] = {}
    for name, tiers in modes.items():
        llm = _llm(device, block_bytes, tiers)
        chat[name] = multi_turn(llm, args)
        llm.engine.close()
        print(
            f"{name:10s} turn-2+ TTFT p50 {chat[name].ttft_p50_s * 1e3:7.2f} ms   "
            f"hit rate {chat[name].hit_rate:.3f}"
        )
    onload = onload_vs_recompute(block_bytes, tmp)
    print(
        f"2048-token prefix: recompute {onload['recompute'] * 1e3:.1f} ms, host "
        f"{onload['host'] * 1e3:.1f} ms, disk {onload['disk'] * 1e3:.1f} ms"
    )
    off_tps = no_reuse(block_bytes, None, 24)
    on_tps = no_reuse(block_bytes, modes["host"], 24)
    disk_tps = no_reuse(block_bytes, modes["host+disk"], 24)
    print(f"no reuse: {off_tps:.0f} tok/s off, {on_tps:.0f} host, {disk_tps:.0f} host+disk")
    if args.plot is not None:
        plot({n: chat[n].timeline for n in ("host", "host+disk", "disk")}, args.plot)
    off = chat["off"]
    summary = {
        "device_blocks": device,
        "working_set_blocks": working_set,
        "ttft_p50_ms": {n: round(c.ttft_p50_s * 1e3, 2) for n, c in chat.items()},
        "hit_rate": {n: round(c.hit_rate, 3) for n, c in chat.items()},
        "ttft_p50_ratio": round(chat["host"].ttft_p50_s / off.ttft_p50_s, 3),
        "hit_rate_ratio": round(chat["host"].hit_rate / max(off.hit_rate, 1e-9), 2),
        "host_onload_ratio": round(onload["host"] / onload["recompute"], 3),
        "disk_onload_ratio": round(onload["disk"] / onload["recompute"], 3),
        "no_reuse_throughput_ratio": round(on_tps / off_tps, 3),
        "no_reuse_throughput_ratio_host_disk": round(disk_tps / off_tps, 3),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
