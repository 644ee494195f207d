"""One planned launch of a Triton kernel, as data: what ``kernel[grid](...)`` will run.

Each launcher builds its :class:`KernelLaunch` from its tensors and a
:class:`~engine.triton_launch.target.KernelTarget`, then runs it; the compile gate builds the same
launches for other GPUs and compiles them without running anything.

FP fusion (contracting ``a * b + c`` into one fused multiply-add) is chosen per kernel, never
left to Triton's default (which changes in Triton 3.10): kernels that replay torch's roundings
bit for bit take :data:`EXACT_ROUNDING` (torch rounds the product, then the sum), kernels checked
against a tolerance take :data:`FUSED_MULTIPLY_ADD` (one rounding instead of two, fewer
instructions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

EXACT_ROUNDING = False  # enable_fp_fusion for kernels bit-exact against torch
FUSED_MULTIPLY_ADD = True  # enable_fp_fusion for kernels compared within a tolerance

_REGISTERS_PER_SM = 65536  # 32-bit registers of an SM on sm_80, sm_90 and sm_100
_MAX_REGISTERS_PER_THREAD = 255


def register_share(num_warps: int) -> int:
    """The registers a thread may use when one program of ``num_warps`` warps has the SM's
    whole register file: a ``max_registers`` that only lifts the compiler's own cap."""
    return min(_MAX_REGISTERS_PER_THREAD, _REGISTERS_PER_SM // (32 * num_warps))


@dataclass(frozen=True)
class KernelLaunch:
    """``kernel[grid](*args, **constexprs, num_warps=..., num_stages=..., enable_fp_fusion=...)``.

    ``num_warps``/``num_stages`` None take Triton's defaults (4 warps; 3 stages on NVIDIA).
    ``max_registers`` (Triton's ``maxnreg``) None leaves a thread's register budget to ptxas,
    which trades registers for occupancy; a launcher sets it where that trade spills.
    """

    kernel: Any  # a triton JITFunction (or the interpreter's stand-in for it)
    grid: tuple[int, ...]
    args: tuple[Any, ...]
    constexprs: Mapping[str, Any]
    fp_fusion: bool
    num_warps: int | None = None
    num_stages: int | None = None
    max_registers: int | None = None

    @property
    def options(self) -> dict[str, Any]:
        """The compile options this launch passes to Triton."""
        options: dict[str, Any] = {"enable_fp_fusion": self.fp_fusion}
        if self.num_warps is not None:
            options["num_warps"] = self.num_warps
        if self.num_stages is not None:
            options["num_stages"] = self.num_stages
        if self.max_registers is not None:
            options["maxnreg"] = self.max_registers
        return options

    def run(self) -> None:
        """Launch the kernel (compiling it first on its first specialization)."""
        self.kernel[self.grid](*self.args, **self.constexprs, **self.options)
