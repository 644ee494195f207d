"""Load a local HF-format checkpoint (config.json + safetensors) into a :class:`CausalLM`.

Files are opened with ``safetensors.safe_open`` (memory-mapped; never ``torch.load``, never
pickle) and copied tensor by tensor straight into the model's parameters, converting dtype on
the way; no state dict is materialised. Before any tensor is read the checkpoint's names and
shapes are checked against the weight map, so a bad checkpoint fails fast with a
:class:`WeightLoadError` naming the tensor. Experts the model does not own are never read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open

from core.errors import ModelNotFoundError, WeightLoadError
from engine.attention.backend import AttentionBackend
from engine.models.config import ModelArchConfig
from engine.models.decoder import CausalLM
from engine.models.tensor_parallel import TPShard, check_tensor_parallel
from engine.models.weight_map import IGNORED_SUFFIXES, WeightMap, WeightSlot, build_weight_map

logger = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
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
    """Build the model described by ``model_dir/config.json`` and fill it from its safetensors.

    ``expert_ids`` (MoE only): the global expert ids to allocate and load; None loads all.
    ``fused_kernels``: the Triton kernels or the torch reference (None: Triton on CUDA only).
    ``tp``: one rank of a tensor-parallel gang, which reads and holds only its slices.
    """
    config = ModelArchConfig.from_dir(model_dir)
    files = checkpoint_files(model_dir)
    names_by_file = {path: _tensor_names(path) for path in files}
    all_names = {name for names in names_by_file.values() for name in names}
    if tp is not None:
        check_tensor_parallel(config, tp.size)
    weight_map = build_weight_map(config, all_names, expert_ids, tp)
    _check_names(Path(model_dir), weight_map, all_names)
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
    for path, names in names_by_file.items():
        wanted = [name for name in names if weight_map.expected.get(name)]
        if wanted:
            _load_file(path, wanted, weight_map, params)
    logger.info("loaded %s (%s) from %s", config.architecture, dtype, model_dir)
    return model.eval()


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The safetensors files of ``model_dir``: the index's shards, or ``model.safetensors``."""
    root = Path(model_dir)
    if not root.is_dir():
        raise ModelNotFoundError(f"model directory {str(root)!r} does not exist", param="model")
    index_path = root / INDEX_FILE
    if index_path.is_file():
        try:
            weight_files = json.loads(index_path.read_text())["weight_map"].values()
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise WeightLoadError(f"cannot read {str(index_path)!r}: {e!r}") from e
        files = [root / name for name in sorted(set(weight_files))]
    else:
        files = [root / SINGLE_FILE]
    for path in files:
        if not path.is_file():
            raise WeightLoadError(f"checkpoint file {str(path)!r} does not exist", param=path.name)
    return files


def _tensor_names(path: Path) -> list[str]:
    try:
        with safe_open(path, framework="pt") as f:
            return list(f.keys())
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise WeightLoadError(f"cannot open {str(path)!r}: {e}", param=path.name) from e


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


def _load_file(
    path: Path,
    names: list[str],
    weight_map: WeightMap,
    params: dict[str, torch.nn.Parameter],
) -> None:
    """Copy ``names`` from one safetensors file into their parameter slots."""
    with safe_open(path, framework="pt") as f:
        for name in names:
            source = f.get_slice(name)
            slots = weight_map.expected[name]
            shape = tuple(source.get_shape())
            if shape != slots[0].checkpoint_shape:
                raise WeightLoadError(
                    f"tensor {name!r} in {str(path)!r} has shape {list(shape)}, "
                    f"expected {list(slots[0].checkpoint_shape)}",
                    param=name,
                )
            for slot in slots:
                index = slot.source_index()  # an expert, a rank's slice: only those bytes
                tensor = f.get_tensor(name) if index is None else source[index]
                _destination(params, slot).copy_(tensor)


def _destination(params: dict[str, torch.nn.Parameter], slot: WeightSlot) -> torch.Tensor:
    """The view of the parameter that ``slot`` fills."""
    dst = params[slot.param].data
    if slot.expert is not None:
        dst = dst[slot.expert]
    return dst.narrow(0, slot.row_start, slot.shape[0])


def _some(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_MAX_NAMED])
    return shown if len(names) <= _MAX_NAMED else f"{shown} and {len(names) - _MAX_NAMED} more"
