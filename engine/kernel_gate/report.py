"""A gate run as plain data (JSON) and as the registers/shared-memory table of
``docs/benchmarks.md``: one row per kernel and variant, the largest build of each target."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from engine.kernel_gate.builds import Build
from engine.kernel_gate.compiler import BuildResult
from engine.kernel_gate.gate import GateRun


def run_to_json(run: GateRun) -> dict[str, Any]:
    """Every build with what it took; the checks that failed; counts and times."""
    return {
        "targets": [target.name for target in run.targets],
        "num_launches": run.num_launches,
        "num_builds": len(run.builds),
        "cache_hits": sum(result.cache_hit for result in run.results),
        "compile_s": round(sum(result.compile_s for result in run.results), 1),
        "wall_s": round(run.wall_s, 1),
        "findings": run.findings,
        "builds": [_build_json(b, r) for b, r in zip(run.builds, run.results, strict=True)],
    }


def _build_json(build: Build, result: BuildResult) -> dict[str, Any]:
    names = list(build.spec.signature)
    return {
        "kernel": build.spec.name,
        "target": build.spec.target,
        "capability": build.spec.capability,
        "variant": variant_label(build),
        "cases": sorted(build.cases),
        "constexprs": {names[path[0]]: str(v) for path, v in build.spec.constexprs.items()},
        "options": build.spec.options,
        "registers": result.registers,
        "stack_bytes": result.stack_bytes,
        "shared_bytes": result.shared_bytes,
        "compile_s": round(result.compile_s, 2),
        "cache_hit": result.cache_hit,
        "error": result.error,
    }


_KV_POINTERS = {"*i8": "kv int8", "*fp8e4nv": "kv fp8_e4m3", "*u8": "kv fp8_e4m3 as bytes"}


def variant_label(build: Build) -> str:
    """What a build reads, where it tells kernels apart: an 8-bit KV cache (fp8 as bytes where
    the target has no e4m3), int8 expert weights; ``-`` otherwise."""
    signature = build.spec.signature
    if "kv_ptr" in signature:
        return _KV_POINTERS.get(signature["kv_ptr"], "kv auto")
    if signature.get("w_ptr") == "*i8":
        return "int8 weights"
    return "-"


def markdown_table(run: GateRun) -> str:
    """Per kernel and variant: builds, then per target the most registers a thread, the most
    shared memory a program (KiB) and, where any, the spill stack."""
    cells: dict[tuple[str, str], dict[str, list[BuildResult]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for build, result in zip(run.builds, run.results, strict=True):
        cells[(build.spec.name, variant_label(build))][build.spec.target].append(result)
    names = [target.name for target in run.targets]
    lines = [
        "| kernel | variant | builds | "
        + " | ".join(f"{n} regs / shared KiB" for n in names)
        + " |",
        "|---" * (3 + len(names)) + "|",
    ]
    for (kernel, variant), per_target in sorted(cells.items()):
        count = sum(len(results) for results in per_target.values())
        row = [f"`{kernel.strip('_')}`", variant, str(count)]
        row.extend(_cell(per_target.get(name, [])) for name in names)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _cell(results: list[BuildResult]) -> str:
    if not results:
        return "-"
    if any(result.error for result in results):
        return "compile error"
    registers = max(result.registers for result in results)
    shared_kib = max(result.shared_bytes for result in results) / 1024
    stack = max(result.stack_bytes for result in results)
    return f"{registers} / {shared_kib:.1f}" + (f" (spills {stack} B)" if stack else "")
