"""A planned launch as Triton would compile it: the kernel's specialization for one GPU target.

Triton specializes a kernel on its constexprs and on its other arguments — each tensor's element
type and 16-byte alignment, each integer's divisibility by 16 (or its being 1). The gate asks
Triton's own argument binder for that specialization, so two launches compile to the same build
exactly when they would share a compiled kernel at run time, and each build is compiled once.

The planned tensors live on the meta device; :class:`_CudaLikePointers` gives them the addresses
a CUDA allocation would (aligned, plus the view's offset) while the binder reads them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from torch.overrides import TorchFunctionMode
from triton.backends.compiler import BaseBackend, GPUTarget
from triton.compiler import make_backend
from triton.runtime.jit import create_function_from_signature

from engine.triton_launch import KernelLaunch, KernelTarget


@dataclass(frozen=True)
class BuildSpec:
    """What ``triton.compile`` needs to build one specialization of a kernel for a target."""

    module: str  # the kernel's module and name, to import it in a compile worker
    name: str
    target: str  # "sm_90"
    capability: int  # 90
    signature: dict[str, str]
    constexprs: dict[tuple[int, ...], Any]
    attrs: dict[tuple[int, ...], Any]
    options: dict[str, Any]


@dataclass
class Build:
    """One distinct build and the cases that launch it."""

    spec: BuildSpec
    cases: set[str] = field(default_factory=set)


class _CudaLikePointers(TorchFunctionMode):
    """``data_ptr()`` of a meta tensor as if allocated by CUDA: 0 (aligned to anything) plus its
    view's byte offset — Triton's binder checks pointers for 16-byte alignment."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "data_ptr" and args[0].device.type == "meta":
            tensor = args[0]
            return tensor.storage_offset() * tensor.element_size()
        return func(*args, **(kwargs or {}))


@functools.cache
def _backend(capability: int) -> BaseBackend:
    return make_backend(GPUTarget("cuda", capability, 32))


def gpu_capability(target: KernelTarget) -> int:
    """``(9, 0)`` -> 90, as Triton's targets name a capability."""
    if target.capability is None:
        raise ValueError(f"{target.name} is not a GPU")
    major, minor = target.capability
    return major * 10 + minor


def build_spec(launch: KernelLaunch, target: KernelTarget) -> BuildSpec:
    """The specialization Triton compiles ``launch`` to on ``target``."""
    kernel = launch.kernel
    capability = gpu_capability(target)
    backend = _backend(capability)
    binder = _binder(kernel, capability)
    with _CudaLikePointers():
        _, specialization, _ = binder(*launch.args, **launch.constexprs, **launch.options)
    names = [param.name for param in kernel.params]
    signature = {name: kind for name, (kind, _) in zip(names, specialization, strict=True)}
    constexprs: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    for index, (kind, value) in enumerate(specialization):
        if kind == "constexpr":
            constexprs[(index,)] = value
        elif isinstance(value, str):
            attrs[(index,)] = backend.parse_attr(value)
    return BuildSpec(
        kernel.fn.__module__,
        kernel.fn.__name__,
        target.name,
        capability,
        signature,
        constexprs,
        attrs,
        dict(launch.options),
    )


@functools.cache
def _binder(kernel: Any, capability: int) -> Any:
    """Triton's argument binder of ``kernel`` for a target (what a launch runs first)."""
    return create_function_from_signature(kernel.signature, kernel.params, _backend(capability))


def spec_key(spec: BuildSpec) -> str:
    """Equal for two specs exactly when they build the same kernel binary."""
    return repr(
        (
            spec.module,
            spec.name,
            spec.target,
            sorted(spec.signature.items()),
            sorted(spec.constexprs.items()),
            sorted(spec.attrs.items()),
            sorted(spec.options.items()),
        )
    )
