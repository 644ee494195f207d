"""Loads one PEFT LoRA adapter directory into host tensors, checked whole before it is used.

Every check runs before the adapter exists: its config (:mod:`engine.lora.peft_config`), its
rank against ``max_lora_rank``, its base model against the served one
(:func:`base_model_matches`), every tensor's name against the model's targets and every shape
against the target's; a failure raises one typed error and leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from core.errors import (
    LoRABaseModelError,
    LoRAConfigError,
    LoRAFileError,
    LoRARankError,
    LoRATargetError,
)
from engine.lora.peft_config import PeftLoRAConfig, read_peft_config
from engine.lora.request import LoRARequest
from engine.models.lora import SUPPORTED_MODULES, LoRATarget

WEIGHTS_FILE = "adapter_model.safetensors"

_KEY = re.compile(
    r"^base_model\.model\.(?:model\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)"
    r"\.lora_([AB])(?:\.[\w-]+)?\.weight$"
)
"""PEFT's tensor names: ``base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight``."""


@dataclass(frozen=True)
class ServedBase:
    """What an adapter's ``base_model_name_or_path`` is compared with: the model's configured
    name (a built-in name, hub id or path) and its resolved checkpoint directory."""

    name: str
    model_dir: Path


@dataclass(frozen=True)
class LoRAAdapter:
    """An adapter in host memory: per (layer, PEFT module) ``(A [r, in], B [out, r])``."""

    name: str
    int_id: int
    path: str
    rank: int
    scale: float
    weights: Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


def base_model_matches(adapter_base: str | None, served: ServedBase) -> bool:
    """True when the adapter names no base, or names the served model: the same configured
    name, a path to the same directory, or the same last path component (a hub id
    ``org/Model`` matches a local directory ``.../Model``)."""
    if not adapter_base:
        return True
    if adapter_base == served.name:
        return True
    candidate = Path(adapter_base).expanduser()
    with contextlib.suppress(OSError):  # not a path this machine can stat: compare names
        if candidate.is_dir() and candidate.resolve() == served.model_dir.resolve():
            return True
    tail = adapter_base.rstrip("/").rsplit("/", 1)[-1]
    served_tails = {served.model_dir.name, served.name.rstrip("/").rsplit("/", 1)[-1]}
    return tail in served_tails


def load_adapter(
    request: LoRARequest,
    *,
    max_rank: int,
    targets: Mapping[tuple[int, str], LoRATarget],
    served: ServedBase,
    dtype: torch.dtype,
) -> LoRAAdapter:
    """Read and check ``request``'s adapter against the served model; typed errors
    (:class:`~core.errors.LoRAAdapterError` subclasses) name what is wrong."""
    name = request.lora_name
    adapter_dir = Path(request.lora_path).expanduser()
    try:
        found = adapter_dir.is_dir()
    except OSError as e:  # a name too long, a path through a file, ...
        raise LoRAFileError(f"adapter {name!r}: bad path {adapter_dir}: {e}", param=name) from e
    if not found:
        raise LoRAFileError(f"adapter {name!r}: no directory {adapter_dir}", param=name)
    config = read_peft_config(adapter_dir, name)
    if config.rank > max_rank:
        raise LoRARankError(
            f"adapter {name!r}: rank {config.rank} exceeds max_lora_rank ({max_rank})",
            param=name,
        )
    if not base_model_matches(config.base_model, served):
        raise LoRABaseModelError(
            f"adapter {name!r} was trained on {config.base_model!r}, not on the served "
            f"model {served.name!r}",
            param=name,
        )
    _check_named_targets(config, targets, name)
    tensors = _read_tensors(adapter_dir / WEIGHTS_FILE, name)
    weights = _pair_up(tensors, config, targets, name, dtype)
    return LoRAAdapter(
        name, request.lora_int_id, str(adapter_dir), config.rank, config.scale, weights
    )


def _check_named_targets(
    config: PeftLoRAConfig, targets: Mapping[tuple[int, str], LoRATarget], name: str
) -> None:
    if config.target_modules is None:
        return
    available = {module for _, module in targets}
    missing = sorted(set(config.target_modules) - available)
    if missing:
        raise LoRATargetError(
            f"adapter {name!r} targets {missing}, which the served model lacks (it can adapt "
            f"{sorted(available)})",
            param=name,
        )


def _read_tensors(path: Path, name: str) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise LoRAFileError(f"adapter {name!r}: no {path.name} in {path.parent}", param=name)
    try:
        with safe_open(str(path), framework="pt") as f:
            return {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 (not a dict)
    except (SafetensorError, OSError, ValueError) as e:
        raise LoRAFileError(f"adapter {name!r}: cannot read {path}: {e}", param=name) from e


def _pair_up(
    tensors: Mapping[str, torch.Tensor],
    config: PeftLoRAConfig,
    targets: Mapping[tuple[int, str], LoRATarget],
    name: str,
    dtype: torch.dtype,
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """The tensors as (A, B) per target, every name and shape checked."""
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None and (".lora_A." in key or ".lora_B." in key):
            raise LoRATargetError(
                f"adapter {name!r}: {key} targets a module pdserve cannot adapt (it adapts "
                f"{', '.join(SUPPORTED_MODULES)} of the decoder layers)",
                param=name,
            )
        if match is None:
            raise LoRAConfigError(f"adapter {name!r}: unsupported tensor {key}", param=name)
        layer, module, half = int(match[1]), match[2], match[3]
        if module not in SUPPORTED_MODULES or (layer, module) not in targets:
            raise LoRATargetError(
                f"adapter {name!r}: {key} targets a module the served model lacks", param=name
            )
        halves.setdefault((layer, module), {})[half] = tensor
    if not halves:
        raise LoRAFileError(f"adapter {name!r}: {WEIGHTS_FILE} holds no LoRA tensors", param=name)
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for where, pair in halves.items():
        target = targets[where]
        expected = {
            "A": (config.rank, target.in_features),
            "B": (target.out_features, config.rank),
        }
        for half, shape in expected.items():
            found = pair.get(half)
            if found is None or tuple(found.shape) != shape:
                got = None if found is None else tuple(found.shape)
                raise LoRAFileError(
                    f"adapter {name!r}: layer {where[0]} {where[1]}.lora_{half} has shape "
                    f"{got}, expected {shape}",
                    param=name,
                )
        weights[where] = (pair["A"].to(dtype).contiguous(), pair["B"].to(dtype).contiguous())
    return weights
