"""KV capacity sizer (``pdserve size``): KV bytes per token, requests per GPU, GPUs needed."""

from sizer.gpus import GPUS, GpuSpec, get_gpu
from sizer.kv_capacity import CapacityPlan, CapacityRow, SizingInputs, plan_capacity
from sizer.model_dir import load_model_shape, shape_from_config
from sizer.model_presets import PRESETS, get_preset, preset_names
from sizer.shape import ModelShape
from sizer.sizing import SizingRequest, SizingResult, size_model
from sizer.split import PDSplit, suggest_split

__all__ = [
    "GPUS",
    "PRESETS",
    "CapacityPlan",
    "CapacityRow",
    "GpuSpec",
    "ModelShape",
    "PDSplit",
    "SizingInputs",
    "SizingRequest",
    "SizingResult",
    "get_gpu",
    "get_preset",
    "load_model_shape",
    "plan_capacity",
    "preset_names",
    "shape_from_config",
    "size_model",
    "suggest_split",
]
