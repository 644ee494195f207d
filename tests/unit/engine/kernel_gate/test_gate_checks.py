"""The compile gate's parts without its full run: what fails it, what it counts as one build,
which path the launchers plan per GPU, and that a kernel Triton cannot build for a GPU fails it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.kernel_gate.builds import Build, build_spec, spec_key
from engine.kernel_gate.checks import findings
from engine.kernel_gate.compiler import BuildResult, compile_build
from engine.kernel_gate.plans import GATE_ENGINE_CONFIG, EngineCase, plan_case
from engine.triton_launch import A100, H100, KernelLaunch, interpreter_active

FP8_CASE = EngineCase("llama-3.2-1b", torch.bfloat16, "fp8_e4m3")


def launches_of(case: EngineCase, target, kernel_name: str) -> list[KernelLaunch]:
    return [
        launch
        for launch in plan_case(case, target, GATE_ENGINE_CONFIG)
        if launch.kernel.fn.__name__ == kernel_name
    ]


def test_findings_name_compile_errors_shared_memory_and_spills() -> None:
    launch = launches_of(FP8_CASE, H100, "_write_kv_quant_kernel")[0]
    build = Build(build_spec(launch, H100), {FP8_CASE.label})
    results = [
        BuildResult(registers=40, shared_bytes=1024),
        BuildResult(error="CompilationError: nope"),
        BuildResult(registers=40, shared_bytes=H100.max_shared_bytes + 1),
        BuildResult(registers=255, stack_bytes=16),
    ]
    lines = findings([build] * 4, results, [H100])
    assert len(lines) == 3
    assert "does not compile: CompilationError: nope" in lines[0]
    assert f"the target has {H100.max_shared_bytes}" in lines[1]
    assert "spills (255 registers, 16 bytes" in lines[2]
    assert all(line.startswith("_write_kv_quant_kernel on sm_90 (llama-3.2-1b/") for line in lines)


def test_step_sizes_that_only_change_the_grid_share_one_build() -> None:
    # cache writes of 1 to 8,192 tokens; decode batches split (1..8 sequences) and not (64)
    for kernel in ("_rope_write_kv_kernel", "_paged_decode_kernel", "_paged_prefill_kernel"):
        launches = launches_of(FP8_CASE, H100, kernel)
        assert len({launch.grid for launch in launches}) > 1
        assert len({spec_key(build_spec(launch, H100)) for launch in launches}) == 1, kernel


def test_fp8_cache_is_read_as_bytes_only_without_native_e4m3() -> None:
    for target, as_bytes in ((A100, True), (H100, False)):
        for kernel in ("_paged_decode_kernel", "_paged_prefill_kernel", "_rope_write_kv_kernel"):
            spec = build_spec(launches_of(FP8_CASE, target, kernel)[0], target)
            assert spec.signature["kv_ptr"] == ("*u8" if as_bytes else "*fp8e4nv")


def test_a_kernel_triton_cannot_build_for_the_gpu_fails_the_gate() -> None:
    """The launch planned for an H100 (native e4m3), built for an A100: the compile error an
    A100 replica would hit on its first fp8 request, had its launcher planned it so."""
    assert not interpreter_active(), "run without TRITON_INTERPRET: the gate compiles kernels"
    launch = launches_of(FP8_CASE, H100, "_write_kv_quant_kernel")[0]
    spec = dataclasses.replace(build_spec(launch, H100), target=A100.name, capability=80)
    result = compile_build(spec)
    assert "fp8e4nv not supported" in result.error
    assert findings([Build(spec, {FP8_CASE.label})], [result], [A100])


@pytest.mark.parametrize("target", [A100, H100], ids=lambda t: t.name)
def test_every_launch_chooses_fp_fusion(target) -> None:
    for launch in plan_case(
        EngineCase("qwen3-30b-a3b", torch.float16, "int8", int8_weights=True),
        target,
        GATE_ENGINE_CONFIG,
    ):
        assert isinstance(launch.options["enable_fp_fusion"], bool)
        if launch.kernel.fn.__name__ == "_moe_gemm_kernel":  # its whole register share
            assert launch.options["maxnreg"] * 32 * launch.num_warps <= 65536
