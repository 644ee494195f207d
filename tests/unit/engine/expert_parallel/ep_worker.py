"""One rank of a real (gloo, multi-process) expert-parallel gang, driven by a JSON job file.

Run as ``python -m tests.unit.engine.expert_parallel.ep_worker JOB RANK`` from the repository root.
The job lists scenarios (model, prompts per rank, sampling) run one after another over the same
process group, then an ending that exercises failure:

- ``"die"``: both ranks get a long request; rank 1 hard-exits (``os._exit``) after a few lockstep
  steps; rank 0 keeps stepping and records the error it gets and how long it took.
- ``"stall"``: rank 1 stops stepping but stays alive (blocked on stdin until the test closes
  it); rank 0's next collective must time out into a typed error.
- ``"none"``: both ranks leave cleanly.

Each rank writes its results to ``<out_dir>/rank<RANK>.json`` before the ending.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from core.config import EngineConfig, ModelConfig
from core.errors import PdserveError
from core.sampling import SamplingParams
from engine.builtin import resolve_model
from engine.expert_parallel import ExpertPlacement, join_process_group
from engine.expert_parallel.moe_layer import ExpertParallelMoE
from engine.gangs import EPStepper, build_ep_stepper
from engine.models.config import ModelArchConfig

ENGINE = EngineConfig(max_model_len=256, block_size=8, kv_cache_memory_bytes=4 << 20)


def run_scenario(collective: Any, scenario: dict[str, Any]) -> dict[str, Any]:
    """Serve this rank's prompts of ``scenario`` in lockstep; report tokens, steps, stats."""
    rank = collective.rank
    num_experts = ModelArchConfig.from_dir(resolve_model(scenario["model"])).num_experts
    placement = ExpertPlacement.contiguous(num_experts, collective.world_size)
    ep = build_ep_stepper(ModelConfig(name=scenario["model"]), ENGINE, collective, placement)
    params = SamplingParams(max_tokens=scenario["max_tokens"], temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(scenario["prompts"][rank]):
        ep.engine.add_request(f"{scenario['name']}-{rank}-{i}", prompt, params)
    tokens: dict[str, list[int]] = {}
    steps = empty_steps = 0
    while (result := ep.step()).gang_busy:
        steps += 1
        empty_steps += result.ran_empty
        tokens.update({o.request_id: list(o.token_ids) for o in result.outputs if o.finished})
    return {
        "tokens": tokens,
        "steps": steps,
        "empty_steps": empty_steps,
        "held_experts": [
            layer.mlp.moe.gate_up_proj.shape[0]
            for layer in ep.ep_model.model.layers
            if isinstance(layer.mlp, ExpertParallelMoE)
        ],
        "stats": ep.ep_model.stats.snapshot(),
    }


def die_ending(collective: Any, rank: int) -> dict[str, Any]:
    """Rank 1 crashes mid-generation; rank 0 reports the error it gets."""
    placement = ExpertPlacement.contiguous(8, collective.world_size)
    ep = build_ep_stepper(ModelConfig(name="builtin:tiny-moe"), ENGINE, collective, placement)
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    ep.engine.add_request("long", [1, 2, 3], params)
    for _ in range(3):
        ep.step()
    if rank == 1:
        os._exit(17)  # no cleanup: sockets close as the process dies
    return failing_steps(ep)


def stall_ending(collective: Any, rank: int) -> dict[str, Any]:
    """Rank 1 stops stepping but stays alive; rank 0's collective must time out."""
    placement = ExpertPlacement.contiguous(8, collective.world_size)
    ep = build_ep_stepper(ModelConfig(name="builtin:tiny-moe"), ENGINE, collective, placement)
    ep.step()
    if rank == 1:
        sys.stdin.read()  # blocks until the test closes our stdin (after rank 0 is done)
        return {}
    ep.engine.add_request("stalled", [1, 2, 3], SamplingParams(max_tokens=4))
    return failing_steps(ep)


def failing_steps(ep: EPStepper[Any]) -> dict[str, Any]:
    """Step until an error, then step once more on the broken gang; both errors."""
    errors = []
    for _ in range(2):
        try:
            for _ in range(200):
                ep.step()
            errors.append({"type": "none"})
        except PdserveError as e:
            errors.append({"type": type(e).__name__, "status": e.status_code, "message": e.message})
    return {"errors": errors}


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    rank = int(sys.argv[2])
    torch.set_num_threads(1)
    out_dir = Path(job["out_dir"])
    collective = join_process_group(
        rank, job["world_size"], job["init_method"], timeout_s=job["timeout_s"]
    )
    results = {"scenarios": {s["name"]: run_scenario(collective, s) for s in job["scenarios"]}}
    results_path = out_dir / f"rank{rank}.json"
    results_path.write_text(json.dumps(results))
    ending = job["ending"]
    if ending == "die":
        results["ending"] = die_ending(collective, rank)
    elif ending == "stall":
        results["ending"] = stall_ending(collective, rank)
    results_path.write_text(json.dumps(results))
    collective.close()
    if ending:
        # NOTE: a gang broken on purpose leaves gloo's threads in a state whose teardown at
        # interpreter exit may abort; the results are written, so leave without it.
        os._exit(0)


if __name__ == "__main__":
    main()
