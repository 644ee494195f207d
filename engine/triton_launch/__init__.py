"""Planned Triton launches and the targets they are planned for (a GPU, or the interpreter)."""

from engine.triton_launch.launch import (
    EXACT_ROUNDING,
    FUSED_MULTIPLY_ADD,
    KernelLaunch,
    register_share,
)
from engine.triton_launch.target import (
    A100,
    B200,
    H100,
    INTERPRETER,
    KernelTarget,
    cuda_target,
    interpreter_active,
    is_interpreted,
    kernel_target,
)

__all__ = [
    "A100",
    "B200",
    "EXACT_ROUNDING",
    "FUSED_MULTIPLY_ADD",
    "H100",
    "INTERPRETER",
    "KernelLaunch",
    "KernelTarget",
    "cuda_target",
    "interpreter_active",
    "is_interpreted",
    "kernel_target",
    "register_share",
]
