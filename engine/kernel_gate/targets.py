"""The GPU targets the gate compiles for: Ampere and Hopper always, Blackwell (sm_100) when the
ptxas bundled with Triton knows it (CUDA 12.8 on)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence

from triton.backends.nvidia.compiler import get_ptxas

from engine.triton_launch import A100, B200, H100, KernelTarget

_BLACKWELL_CUDA = (12, 8)


def gate_targets(names: Sequence[str] = ()) -> tuple[KernelTarget, ...]:
    """A100 and H100, plus B200 when the bundled toolchain can build for it; only those of
    ``names`` (e.g. ``("sm_80", "sm_90")``) when given. ``ValueError`` for a name it cannot
    build for."""
    available = (A100, H100, B200) if _ptxas_cuda_version(100) >= _BLACKWELL_CUDA else (A100, H100)
    if not names:
        return available
    known = {target.name: target for target in available}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"no gate target {unknown}: this toolchain builds for {sorted(known)}")
    return tuple(known[name] for name in names)


def _ptxas_cuda_version(capability: int) -> tuple[int, int]:
    """The CUDA release of the ptxas Triton runs for ``capability`` (0.0 when it has none)."""
    try:
        version = subprocess.run(
            [get_ptxas(capability).path, "--version"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, RuntimeError, subprocess.CalledProcessError):
        return (0, 0)
    match = re.search(r"release (\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)
