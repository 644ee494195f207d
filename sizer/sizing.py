"""The sizer's entry point: user-facing options in, one ``SizingResult`` (and its JSON) out."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from core.errors import ConfigError
from sizer.gpus import GB, GpuSpec, get_gpu
from sizer.kv_capacity import (
    DEFAULT_TABLE_CONTEXTS,
    CapacityPlan,
    SizingInputs,
    plan_capacity,
)
from sizer.model_dir import load_model_shape
from sizer.shape import KV_DTYPES, WEIGHT_DTYPES, ModelShape, canonical_dtype
from sizer.split import PDSplit, suggest_split
from sizer.tiers import TierCapacity, tier_capacities


@dataclass(frozen=True)
class SizingRequest:
    """The options of ``pdserve size`` (dtypes may be ``auto``: the checkpoint's own)."""

    model: str
    gpu: str = "h100"
    gpu_memory_gb: float | None = None
    memory_utilization: float = 0.9
    weight_dtype: str = "auto"
    kv_dtype: str = "auto"
    weights_gb: float | None = None
    tensor_parallel_size: int | None = None
    context_len_tokens: int = 8192
    output_len_tokens: int = 512
    target_concurrency: int | None = None
    block_size_tokens: int = 16
    table_context_lens: tuple[int, ...] = DEFAULT_TABLE_CONTEXTS
    host_gb: float | None = None
    """Host-RAM KV tier per replica (decimal GB); ``None``: no host tier."""
    disk_gb: float | None = None
    """Disk KV tier per replica (decimal GB); ``None``: no disk tier."""


@dataclass(frozen=True)
class SizingResult:
    """Everything ``pdserve size`` reports."""

    shape: ModelShape
    gpu: GpuSpec
    inputs: SizingInputs
    plan: CapacityPlan
    split: PDSplit
    tiers: tuple[TierCapacity, ...] = ()
    """Sessions per tier, device first (host and disk when sized)."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (bytes as ints, every unit in the key name)."""
        plan = asdict(self.plan)
        table = plan.pop("table")
        return {
            "model": {**asdict(self.shape), "is_mla": self.shape.is_mla},
            "gpu": {**asdict(self.gpu), "memory_bytes": self.inputs.gpu_memory_bytes},
            "inputs": {
                key: value
                for key, value in asdict(self.inputs).items()
                if key not in {"gpu_memory_bytes", "table_context_lens"}
            },
            **plan,
            "capacity_table": table,
            "prefill_decode_split": asdict(self.split),
            "kv_tiers": [asdict(tier) for tier in self.tiers],
        }


def _validate(req: SizingRequest) -> None:
    if not 0.0 < req.memory_utilization <= 1.0:
        raise ConfigError("--memory-utilization must be in (0, 1]", param="memory_utilization")
    positive = {
        "context_len": req.context_len_tokens,
        "output_len": req.output_len_tokens,
        "block_size": req.block_size_tokens,
        "tp": req.tensor_parallel_size or 1,
        "concurrency": req.target_concurrency or 1,
        "gpu_memory_gb": req.gpu_memory_gb or 1,
        "weights_gb": req.weights_gb or 1,
    }
    for name, value in positive.items():
        if value <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be > 0", param=name)
    if any(length <= 0 for length in req.table_context_lens):
        raise ConfigError("--table-context-lens must be positive", param="table_context_lens")


def resolve_dtypes(shape: ModelShape, weight_dtype: str, kv_dtype: str) -> tuple[str, str]:
    """(weight, kv) canonical dtypes; ``auto`` weights: the checkpoint's; ``auto`` KV: weights'
    dtype when it is a KV dtype (bf16 for int4 weights)."""
    weights = shape.default_dtype if weight_dtype == "auto" else weight_dtype
    weights = canonical_dtype(weights, allowed=WEIGHT_DTYPES, param="weight_dtype")
    if kv_dtype == "auto":
        return weights, weights if weights in KV_DTYPES else "bf16"
    return weights, canonical_dtype(kv_dtype, allowed=KV_DTYPES, param="kv_dtype")


def size_model(req: SizingRequest) -> SizingResult:
    """Resolve the model, plan capacity and suggest a prefill/decode split."""
    _validate(req)
    shape = load_model_shape(req.model)
    gpu = get_gpu(req.gpu)
    weight_dtype, kv_dtype = resolve_dtypes(shape, req.weight_dtype, req.kv_dtype)
    memory_bytes = gpu.memory_bytes if req.gpu_memory_gb is None else round(req.gpu_memory_gb * GB)
    inputs = SizingInputs(
        gpu_memory_bytes=memory_bytes,
        kv_dtype=kv_dtype,
        weight_dtype=weight_dtype,
        memory_utilization=req.memory_utilization,
        weight_bytes=None if req.weights_gb is None else round(req.weights_gb * GB),
        tensor_parallel_size=req.tensor_parallel_size,
        context_len_tokens=req.context_len_tokens,
        target_concurrency=req.target_concurrency,
        block_size_tokens=req.block_size_tokens,
        table_context_lens=req.table_context_lens,
    )
    plan = plan_capacity(shape, inputs)
    split = suggest_split(
        shape,
        plan,
        gpu,
        context_len_tokens=req.context_len_tokens,
        output_len_tokens=req.output_len_tokens,
        target_concurrency=req.target_concurrency,
    )
    tiers = tier_capacities(plan, host_gb=req.host_gb, disk_gb=req.disk_gb)
    return SizingResult(shape=shape, gpu=gpu, inputs=inputs, plan=plan, split=split, tiers=tiers)
