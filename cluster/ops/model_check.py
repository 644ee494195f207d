"""``pdserve up``'s model preflight: every served model this machine can see is resolved before
anything is deployed.

A built-in name or a local path (checkpoint directory or ``.gguf`` file) is resolved as the
replicas will resolve it — a bad GGUF file (magic, truncation, architecture, tensor type) or an
unsupported checkpoint is refused in one line before any replica starts, and a GGUF file's
metadata directory or a built-in checkpoint is written once, here, rather than by replicas
racing for it. On a remote cluster a path this machine does not have is left to the replicas.
"""

from __future__ import annotations

from pathlib import Path

from core.builtin_models import BUILTIN_PREFIX
from core.config import ClusterConfig


def check_models(config: ClusterConfig) -> None:
    """Resolve every served model visible here; raises the ``core.errors`` type naming a defect."""
    from engine.builtin import resolve_model
    from engine.models import ModelArchConfig

    for served in config.served_models():
        name = served.model.name
        visible = name.startswith(BUILTIN_PREFIX) or Path(name).expanduser().exists()
        if visible or config.cluster.is_local:
            ModelArchConfig.from_dir(resolve_model(name))
