"""Compile builds for GPUs this machine does not have, in worker processes, and read back what
each compiled kernel takes: registers, spill stack, shared memory.

``triton.compile`` builds for any NVIDIA target on a CPU-only machine and keeps its on-disk cache
(``TRITON_CACHE_DIR``, by default ``~/.triton/cache``), so a second run only reads binaries
back. Registers and the stack frame (where spilled registers go) come from the cubin itself
through the bundled ``cuobjdump``; the shared memory a launch reserves from Triton's metadata.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.kernel_gate.builds import BuildSpec

_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
# the first lines of a compile error say what failed; the rest is Triton's source listing
_ERROR_LINES = 6


@dataclass(frozen=True)
class BuildResult:
    """What one build took, or why it failed (``error``)."""

    registers: int = 0  # per thread
    stack_bytes: int = 0  # per thread: spilled registers (and any local arrays)
    shared_bytes: int = 0  # per program: dynamic (Triton's) plus static
    compile_s: float = 0.0
    cache_hit: bool = False
    error: str = ""


def compile_build(spec: BuildSpec) -> BuildResult:
    """Compile ``spec`` (a cache hit when built before) and measure the kernel."""
    kernel = getattr(importlib.import_module(spec.module), spec.name)
    source = ASTSource(kernel, spec.signature, spec.constexprs, spec.attrs)
    target = GPUTarget("cuda", spec.capability, 32)
    hits: list[bool] = []
    triton.knobs.compilation.listener = lambda **event: hits.append(event["cache_hit"])
    start = time.perf_counter()
    try:
        compiled = triton.compile(source, target=target, options=spec.options)
    except Exception as e:
        message = "\n".join(str(e).strip().splitlines()[:_ERROR_LINES])
        return BuildResult(error=f"{type(e).__name__}: {message}")
    finally:
        triton.knobs.compilation.listener = None
    elapsed_s = time.perf_counter() - start
    registers, stack, static_shared = _cubin_usage(compiled.asm["cubin"])
    return BuildResult(
        registers=registers,
        stack_bytes=stack,
        shared_bytes=compiled.metadata.shared + static_shared,
        compile_s=elapsed_s,
        cache_hit=all(hits),
    )


def _cubin_usage(cubin: bytes) -> tuple[int, int, int]:
    """(registers, stack + local bytes, static shared bytes) of the cubin's one kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        listing = subprocess.run(
            [triton.knobs.nvidia.cuobjdump.path, "--dump-resource-usage", file.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    match = _USAGE.search(listing)
    if match is None:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{listing}")
    registers, stack, shared, local = (int(group) for group in match.groups())
    return registers, stack + local, shared


def available_workers() -> int:
    """The CPU cores this process may use."""
    return len(os.sched_getaffinity(0))
