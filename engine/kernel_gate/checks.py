"""What fails the gate: a kernel that does not compile, takes more shared memory than its target
has, or spills registers (every kernel of the engine runs in its decode or prefill steps)."""

from __future__ import annotations

from collections.abc import Sequence

from engine.kernel_gate.builds import Build
from engine.kernel_gate.compiler import BuildResult
from engine.triton_launch import KernelTarget


def findings(
    builds: Sequence[Build], results: Sequence[BuildResult], targets: Sequence[KernelTarget]
) -> list[str]:
    """One line per failed check, naming the kernel, target and a case that launches it."""
    limits = {target.name: target.max_shared_bytes for target in targets}
    lines = []
    for build, result in zip(builds, results, strict=True):
        where = f"{build.spec.name} on {build.spec.target} ({min(build.cases)})"
        if result.error:
            lines.append(f"{where}: does not compile: {result.error}")
            continue
        if result.shared_bytes > limits[build.spec.target]:
            lines.append(
                f"{where}: takes {result.shared_bytes} bytes of shared memory, the target has "
                f"{limits[build.spec.target]}"
            )
        if result.stack_bytes:
            lines.append(
                f"{where}: spills ({result.registers} registers, {result.stack_bytes} bytes of "
                "stack a thread)"
            )
    return lines
