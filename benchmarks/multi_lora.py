"""Multi-LoRA serving: a batch of eight adapters against the base, adapter-aware routing
against adapter-blind routing, and how long an adapter takes to load.

``mixed_batch_tpot_ratio``: the offline engine decodes 8 requests, each under a different
adapter (one step runs all 8 through the grouped LoRA path), and the same 8 prompts on the base
model; TPOT is the decode time per token after the batch's last first token (EOS ignored,
median of interleaved runs), so the prefill is left out. Target <= 1.3. On a shared machine
wall time swings with the neighbours' load, so ``mixed_batch_cpu_time_ratio`` adds the same
ratio in this process's CPU time per decoded token.

``adapter_routing_hit_ratio``: 3 decode replicas, each with a real ``LoRAManager`` (``max_loras``
4, device/host LRU) over the tiny model, serve a stream of requests over 16 adapters with Zipf
popularity. Each request is placed by the real ``least_loaded`` policy over the replicas'
reported adapters and load (``cluster.routing.adapter_affinity``), once knowing the request's
adapter and once blind to it; a request *hits* when its adapter is in a device slot of the
replica it lands on. Running requests occupy their replica for a few arrivals. Target >= 1.5.

``adapter_load_ms``: median time to load a rank-16 adapter from disk into host memory (read,
every shape checked) plus its copy into a device slot.

Adapters are written here in PEFT's format (adapter_config.json + adapter_model.safetensors,
seeded non-zero weights on q/k/v/o and gate/up/down). Prints a table and one JSON line last.
Usage: ``python benchmarks/multi_lora.py [--model builtin:smollm2-135m-instruct]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from cluster.routing.policies import choose_least_loaded
from cluster.routing.policy_types import CostWeights, PoolRole, ReplicaLoad, RoutingInputs
from engine import LLM, LoRARequest, SamplingParams
from engine.lora.manager import LoRAManager, Residency
from engine.models.lora import LoRATarget

MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ROUTING_MODEL = "builtin:tiny-llama"


def write_adapter(
    directory: Path, targets: dict[tuple[int, str], LoRATarget], rank: int, seed: int
) -> Path:
    """A PEFT adapter of every target, seeded non-zero weights, saved under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for (layer, module), target in targets.items():
        kind = "self_attn" if module in MODULES[:4] else "mlp"
        prefix = f"base_model.model.model.layers.{layer}.{kind}.{module}"
        a = torch.randn(rank, target.in_features, generator=generator) * 0.05
        b = torch.randn(target.out_features, rank, generator=generator) * 0.05
        tensors[f"{prefix}.lora_A.weight"] = a.contiguous()
        tensors[f"{prefix}.lora_B.weight"] = b.contiguous()
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": sorted({module for _, module in targets}),
        "bias": "none",
    }
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory


def lora_manager(llm: LLM) -> LoRAManager:
    manager = llm.engine.parts.lora
    if manager is None:
        raise RuntimeError("the engine was built without enable_lora")
    return manager


@dataclass(frozen=True)
class StepItem:
    """A scheduled request as the LoRAManager reads it."""

    request_id: str
    num_new_tokens: int = 1


# -- mixed batch ---------------------------------------------------------------------------


def tpot_ms(
    llm: LLM, prompts: list[list[int]], loras: list[LoRARequest | None], max_tokens: int
) -> float:
    """Decode milliseconds per token of one batch: from the last request's first token (the
    prefill is over) to the end of the batch, over the ``max_tokens - 1`` steps after it."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outputs = llm.generate(
        prompt_token_ids=prompts, sampling_params=params, lora_request=loras, use_tqdm=False
    )
    ended_s = time.monotonic()
    first_s = max(o.metrics.first_token_time or ended_s for o in outputs if o.metrics)
    return (ended_s - first_s) / (max_tokens - 1) * 1e3


def cpu_ms_per_token(
    llm: LLM, prompts: list[list[int]], loras: list[LoRARequest | None], max_tokens: int
) -> float:
    """This process's CPU milliseconds per decoded token of one batch (``max_tokens`` against
    one token, so the prefill cancels): what the step costs, whatever else the machine runs."""
    spent = []
    for num_tokens in (max_tokens, 1):
        params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
        started = time.process_time()
        llm.generate(
            prompt_token_ids=prompts, sampling_params=params, lora_request=loras, use_tqdm=False
        )
        spent.append(time.process_time() - started)
    return (spent[0] - spent[1]) / (max_tokens - 1) * 1e3


@dataclass(frozen=True)
class MixedBatch:
    """The mixed-batch run's medians (milliseconds)."""

    base_tpot_ms: float
    mixed_tpot_ms: float
    base_cpu_ms: float
    mixed_cpu_ms: float
    load_ms: float


def mixed_batch_tpot(args: argparse.Namespace, adapter_dir: Path) -> MixedBatch:
    """TPOT (wall and CPU time) of the base and of ``args.batch`` adapters, and the adapter
    load time, on ``args.model``."""
    llm = LLM(
        args.model,
        enable_lora=True,
        max_loras=args.batch,
        max_lora_rank=args.rank,
        max_model_len=512,
        enable_prefix_caching=False,
    )
    manager = lora_manager(llm)
    loras: list[LoRARequest | None] = []
    load_ms = []
    for i in range(args.batch):
        path = write_adapter(adapter_dir / f"mixed-{i}", manager.targets, args.rank, seed=i)
        request = LoRARequest(f"mixed-{i}", i + 1, str(path))
        started = time.perf_counter()
        manager.bind(request.lora_name, request)  # from disk into host memory, checked
        manager.prepare_step([StepItem(request.lora_name)])  # into a device slot
        load_ms.append((time.perf_counter() - started) * 1e3)
        manager.unbind(request.lora_name)
        loras.append(request)
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 200) for _ in range(args.prompt_tokens)] for _ in loras]
    base: list[LoRARequest | None] = [None] * len(prompts)
    tpot_ms(llm, prompts, loras, 2)  # warm-up: every adapter into its slot
    runs: dict[str, list[float]] = {"base": [], "mixed": [], "base_cpu": [], "mixed_cpu": []}
    for _ in range(args.repeats):  # interleaved, so both see the same machine
        runs["base"].append(tpot_ms(llm, prompts, base, args.tokens))
        runs["mixed"].append(tpot_ms(llm, prompts, loras, args.tokens))
        runs["base_cpu"].append(cpu_ms_per_token(llm, prompts, base, args.tokens))
        runs["mixed_cpu"].append(cpu_ms_per_token(llm, prompts, loras, args.tokens))
    median = {name: statistics.median(values) for name, values in runs.items()}
    return MixedBatch(
        median["base"],
        median["mixed"],
        median["base_cpu"],
        median["mixed_cpu"],
        statistics.median(load_ms),
    )


# -- routing -------------------------------------------------------------------------------


@dataclass
class SimReplica:
    """One decode replica in the routing simulation: a real LoRAManager and its running
    requests (each with the arrival at which it finishes)."""

    replica_id: str
    manager: LoRAManager
    running: deque[tuple[int, str]]

    def load(self) -> ReplicaLoad:
        stats = self.manager.adapter_stats()
        return ReplicaLoad(
            self.replica_id,
            num_running_requests=len(self.running),
            num_free_blocks=1000,
            device_adapters=frozenset(s.name for s in stats if s.residency == "device"),
            host_adapters=frozenset(s.name for s in stats if s.residency == "host"),
        )


def zipf_choices(num: int, num_adapters: int, exponent: float, seed: int) -> list[int]:
    weights = [1.0 / (rank + 1) ** exponent for rank in range(num_adapters)]
    return random.Random(seed).choices(range(num_adapters), weights=weights, k=num)


def routing_hit_rate(
    args: argparse.Namespace, llms: list[LLM], paths: list[Path], aware: bool
) -> float:
    """Share of requests whose adapter was in a device slot of the replica they landed on."""
    replicas = []
    for i, llm in enumerate(llms):
        manager = lora_manager(llm)
        for name in list(manager.residencies()):
            manager.remove_adapter(name)
        replicas.append(SimReplica(f"r{i}", manager, deque()))
    weights = CostWeights.for_role(PoolRole.DECODE)
    picks = zipf_choices(args.requests, len(paths), args.zipf, seed=7)
    rng = random.Random(11)
    hits = 0
    for arrival, adapter in enumerate(picks):
        for replica in replicas:  # requests that ended leave their replica
            while replica.running and replica.running[0][0] <= arrival:
                replica.manager.unbind(replica.running.popleft()[1])
        name = f"zipf-{adapter}"
        inputs = RoutingInputs(
            PoolRole.DECODE,
            tuple(r.load() for r in replicas),
            lora_name=name if aware else None,
            tie_break=arrival,
        )
        chosen = next(
            r for r in replicas if r.replica_id == choose_least_loaded(inputs, weights).replica_id
        )
        hits += chosen.manager.residency(name) is Residency.DEVICE
        request_id = f"req-{arrival}"
        chosen.manager.bind(request_id, LoRARequest(name, adapter + 1, str(paths[adapter])))
        chosen.manager.prepare_step([StepItem(request_id)])  # its first step: into a slot
        ends = arrival + rng.randint(1, args.duration)
        chosen.running.append((ends, request_id))
        chosen.running = deque(sorted(chosen.running))
    for replica in replicas:
        for _, request_id in replica.running:
            replica.manager.unbind(request_id)
    return hits / len(picks)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark (``argv``: the command line; None: ``sys.argv``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="builtin:tiny-llama", help="model of the TPOT run")
    parser.add_argument("--batch", type=int, default=8, help="requests (one adapter each)")
    parser.add_argument("--rank", type=int, default=16, help="adapter rank")
    parser.add_argument("--tokens", type=int, default=32, help="tokens decoded per request")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="TPOT runs per kind (median)")
    parser.add_argument("--adapters", type=int, default=16, help="adapters in the routing run")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--max-loras", type=int, default=4)
    parser.add_argument("--max-cpu-loras", type=int, default=8)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--duration", type=int, default=6, help="most arrivals a request runs")
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of popularity")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        mixed = mixed_batch_tpot(args, Path(tmp))
        llms = [
            LLM(
                ROUTING_MODEL,
                enable_lora=True,
                max_loras=args.max_loras,
                max_cpu_loras=args.max_cpu_loras,
                max_lora_rank=args.rank,
                max_model_len=256,
            )
            for _ in range(args.replicas)
        ]
        targets = lora_manager(llms[0]).targets
        paths = [
            write_adapter(Path(tmp) / f"zipf-{i}", targets, args.rank, seed=100 + i)
            for i in range(args.adapters)
        ]
        aware = routing_hit_rate(args, llms, paths, aware=True)
        blind = routing_hit_rate(args, llms, paths, aware=False)
    print(f"{'':28}{'value':>10}")
    print(f"{'base TPOT (ms)':28}{mixed.base_tpot_ms:10.3f}")
    print(f"{f'{args.batch} adapters TPOT (ms)':28}{mixed.mixed_tpot_ms:10.3f}")
    print(f"{'base CPU ms per token':28}{mixed.base_cpu_ms:10.3f}")
    print(f"{f'{args.batch} adapters CPU ms/token':28}{mixed.mixed_cpu_ms:10.3f}")
    print(f"{'adapter-aware hit rate':28}{aware:10.3f}")
    print(f"{'adapter-blind hit rate':28}{blind:10.3f}")
    print(f"{'adapter load (ms)':28}{mixed.load_ms:10.2f}")
    result = {
        "model": args.model,
        "base_tpot_ms": round(mixed.base_tpot_ms, 4),
        "mixed_tpot_ms": round(mixed.mixed_tpot_ms, 4),
        "mixed_batch_tpot_ratio": round(mixed.mixed_tpot_ms / mixed.base_tpot_ms, 3),
        "mixed_batch_cpu_time_ratio": round(mixed.mixed_cpu_ms / mixed.base_cpu_ms, 3),
        "adapter_aware_hit_rate": round(aware, 4),
        "adapter_blind_hit_rate": round(blind, 4),
        "adapter_routing_hit_ratio": round(aware / blind, 3) if blind else None,
        "adapter_load_ms": round(mixed.load_ms, 3),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
