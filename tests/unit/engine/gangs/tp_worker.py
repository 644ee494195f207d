"""One rank of a real (gloo, multi-process) tensor-parallel model, driven from the command line.

Run as ``python -m tests.unit.engine.gangs.tp_worker CHECKPOINT INIT_METHOD RANK SIZE OUT``
from the repository root: joins the gang, loads its slices of the checkpoint, greedy-decodes
the prompts of ``tests.unit.engine.gangs.tp_prompts`` and writes the tokens to
``OUT`` as JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from engine.expert_parallel import join_process_group
from engine.loader import load_model
from engine.models.tp_shard import TPShard
from tests.unit.engine.gangs.tp_prompts import NEW_TOKENS, PROMPTS
from tests.unit.engine.models.hf_checkpoints import greedy_generate, torch_backend


def main(checkpoint: str, init_method: str, rank: int, size: int, out: str) -> None:
    collective = join_process_group(rank, size, init_method, timeout_s=60.0)
    try:
        model = load_model(
            checkpoint,
            dtype=torch.float32,
            device="cpu",
            attn_backend=torch_backend(),
            tp=TPShard(rank, size, collective),
        )
        tokens, _ = greedy_generate(model, PROMPTS, NEW_TOKENS)
        Path(out).write_text(json.dumps(tokens))
    finally:
        collective.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
