"""``pdserve up``'s model preflight: every served model this machine can see is resolved before
anything is deployed.

A built-in name or a local path (checkpoint directory or ``.gguf`` file) is resolved as the
replicas will resolve it — a bad GGUF file (magic, truncation, architecture, tensor type) or an
unsupported checkpoint is refused in one line before any replica starts, and a GGUF file's
metadata directory or a built-in checkpoint is written once, here, rather than by replicas
racing for it. On a remote cluster a path this machine does not have is left to the replicas.
The check runs in a child process: ``up`` lives as long as the app and stays without torch.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from core.builtin_models import BUILTIN_PREFIX
from core.config import ClusterConfig


def check_models(config: ClusterConfig) -> None:
    """Resolve every served model visible here; raises the ``core.errors`` type naming a defect."""
    names = [
        served.model.name
        for served in config.served_models()
        if config.cluster.is_local
        or served.model.name.startswith(BUILTIN_PREFIX)
        or Path(served.model.name).expanduser().exists()
    ]
    if not names:
        return
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
        child.submit(resolve_all, names).result()


def resolve_all(names: list[str]) -> None:
    """Resolve each model and parse its config (in the child process)."""
    from engine.builtin import resolve_model
    from engine.models import ModelArchConfig

    for name in names:
        ModelArchConfig.from_dir(resolve_model(name))
