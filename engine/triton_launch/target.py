"""What the Triton launchers choose code paths and tile sizes from: the GPU a kernel will run on.

A launcher never asks the device itself: it plans its launch for a :class:`KernelTarget`, which
:func:`kernel_target` resolves from a tensor's device (or Triton's CPU interpreter) at run time and
which the compile gate (``engine.kernel_gate``) names for GPUs this machine does not have — so
both see the very same choices.

Triton decides at *import* time whether ``@triton.jit`` compiles or interprets
(``TRITON_INTERPRET`` must be set before triton is first imported); :func:`is_interpreted` reads
that decision back from a kernel object, so launchers and tests never guess from the environment.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction

#: Compute capability from which Triton converts float8 e4m3 (``fp8e4nv``) natively: Ada and
#: Hopper on. An A100 (8.0) takes the cache's bytes and converts them in software.
NATIVE_FP8_CAPABILITY = (8, 9)


@dataclass(frozen=True)
class KernelTarget:
    """The device a launch is planned for: a CUDA GPU, or Triton's CPU interpreter."""

    name: str  # "sm_90", or "interpreter"
    capability: tuple[int, int] | None  # None: the interpreter, where every type is native
    num_sms: int  # streaming multiprocessors (programs of one wave)
    max_shared_bytes: int  # shared memory one program may take (0: no limit, the interpreter)

    @property
    def interpreted(self) -> bool:
        """True for Triton's CPU interpreter (launches take its own, larger tiles)."""
        return self.name == "interpreter"

    @property
    def native_fp8_e4m3(self) -> bool:
        """Whether kernels may use float8 e4m3 values as such (else they convert bytes)."""
        return self.capability is None or self.capability >= NATIVE_FP8_CAPABILITY


# A small GPU's worth of SMs: the interpreter takes the split-KV path as GPUs do at small batch.
INTERPRETER = KernelTarget("interpreter", None, num_sms=16, max_shared_bytes=0)

# The datacenter GPU of each generation the kernels are compiled for by the gate: SM counts and
# the opt-in shared memory per block of an A100, an H100 SXM and a B200.
A100 = KernelTarget("sm_80", (8, 0), num_sms=108, max_shared_bytes=166_912)
H100 = KernelTarget("sm_90", (9, 0), num_sms=132, max_shared_bytes=232_448)
B200 = KernelTarget("sm_100", (10, 0), num_sms=148, max_shared_bytes=232_448)


def is_interpreted(kernel: Any) -> bool:
    """True when ``kernel`` runs in Triton's CPU interpreter rather than compiled for a GPU."""
    return isinstance(kernel, InterpretedFunction)


@triton.jit
def _mode_probe():
    # An empty kernel decorated like every other kernel of the engine: it shares their mode.
    pass


def interpreter_active() -> bool:
    """True when the engine's kernels were built for the CPU interpreter."""
    return is_interpreted(_mode_probe)


def kernel_target(device: torch.device) -> KernelTarget:
    """The target a launch on ``device`` runs on: the interpreter, or that CUDA GPU."""
    if interpreter_active():
        return INTERPRETER
    return cuda_target(device)


def cuda_target(device: torch.device) -> KernelTarget:
    """The CUDA GPU ``device`` as a target (compiled kernels run on CUDA devices only)."""
    if device.type != "cuda":
        raise ValueError(f"compiled Triton kernels run on CUDA devices, not {device}")
    return _cuda_target(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_target(index: int) -> KernelTarget:
    props = torch.cuda.get_device_properties(index)
    shared = triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]
    return KernelTarget(
        f"sm_{props.major}{props.minor}",
        (props.major, props.minor),
        num_sms=props.multi_processor_count,
        max_shared_bytes=int(shared),
    )
