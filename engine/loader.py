"""Load a local checkpoint directory into a :class:`CausalLM`.

The checkpoint is HF safetensors or a GGUF file's metadata directory; either way its tensors
come through one :class:`~engine.checkpoint.CheckpointTensors` under HF names and are copied
tensor by tensor straight into the model's parameters, converting dtype on the way; no state
dict is materialised. Before any tensor is read the checkpoint's names and shapes are checked
against the weight map, so a bad checkpoint fails fast with a :class:`WeightLoadError` naming
the tensor. Experts the model does not own are never read.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from core.errors import WeightLoadError
from engine.attention.backend import AttentionBackend
from engine.checkpoint import CheckpointTensors, open_checkpoint_tensors
from engine.models.config import ModelArchConfig
from engine.models.decoder import CausalLM
from engine.models.tp_shard import TPShard
from engine.models.tp_split import check_tensor_parallel
from engine.models.weight_map import IGNORED_SUFFIXES, WeightMap, WeightSlot, build_weight_map

logger = logging.getLogger(__name__)

_MAX_NAMED = 5


def load_model(
    model_dir: str | Path,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    attn_backend: AttentionBackend,
    expert_ids: Sequence[int] | None = None,
    fused_kernels: bool | None = None,
    tp: TPShard | None = None,
) -> CausalLM:
    """Build the model described by ``model_dir/config.json`` and fill it from its weights.

    ``expert_ids`` (MoE only): the global expert ids to allocate and load; None loads all.
    ``fused_kernels``: the Triton kernels or the torch reference (None: Triton on CUDA only).
    ``tp``: one rank of a tensor-parallel gang, which reads and holds only its slices.
    """
    config = ModelArchConfig.from_dir(model_dir)
    with open_checkpoint_tensors(model_dir, config) as tensors:
        all_names = tensors.names()
        if tp is not None:
            check_tensor_parallel(config, tp.size)
        weight_map = build_weight_map(config, all_names, expert_ids, tp)
        _check_names(Path(model_dir), weight_map, set(all_names))
        model = CausalLM(
            config,
            attn_backend,
            dtype=dtype,
            device=device,
            expert_ids=expert_ids,
            fused_kernels=fused_kernels,
            tp=tp,
        )
        params = dict(model.named_parameters())
        for name in all_names:
            if weight_map.expected.get(name):
                _load_tensor(tensors, name, weight_map.expected[name], params)
    logger.info("loaded %s (%s) from %s", config.architecture, dtype, model_dir)
    return model.eval()


def _check_names(root: Path, weight_map: WeightMap, names: set[str]) -> None:
    missing = sorted(set(weight_map.expected) - names)
    if missing:
        raise WeightLoadError(
            f"checkpoint {str(root)!r} is missing tensor(s) {_some(missing)}", param=missing[0]
        )
    unexpected = sorted(
        name
        for name in names - weight_map.expected.keys() - weight_map.skipped
        if not name.endswith(IGNORED_SUFFIXES)
    )
    if unexpected:
        raise WeightLoadError(
            f"checkpoint {str(root)!r} has unexpected tensor(s) {_some(unexpected)}",
            param=unexpected[0],
        )


def _load_tensor(
    tensors: CheckpointTensors,
    name: str,
    slots: list[WeightSlot],
    params: dict[str, torch.nn.Parameter],
) -> None:
    """Copy checkpoint tensor ``name`` into its parameter slots."""
    shape = tensors.shape(name)
    if shape != slots[0].checkpoint_shape:
        raise WeightLoadError(
            f"tensor {name!r} has shape {list(shape)}, expected {list(slots[0].checkpoint_shape)}",
            param=name,
        )
    for slot in slots:
        # an expert, a rank's slice: only those bytes
        _destination(params, slot).copy_(tensors.read(name, slot.source_index()))


def _destination(params: dict[str, torch.nn.Parameter], slot: WeightSlot) -> torch.Tensor:
    """The view of the parameter that ``slot`` fills."""
    dst = params[slot.param].data
    if slot.expert is not None:
        dst = dst[slot.expert]
    return dst.narrow(0, slot.row_start, slot.shape[0])


def _some(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_MAX_NAMED])
    return shown if len(names) <= _MAX_NAMED else f"{shown} and {len(names) - _MAX_NAMED} more"
