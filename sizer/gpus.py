"""Accelerators the sizer knows: nominal memory, dense bf16 throughput and HBM bandwidth.

Memory is the marketed capacity in decimal GB (an "80 GB" H100 is sized as 80e9 bytes), the
convention the sizing articles use; throughput is the dense (no sparsity) bf16 tensor peak.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import ConfigError

GB = 1_000_000_000


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator model's datasheet numbers."""

    name: str
    memory_gb: float
    bf16_tflops: float
    hbm_tb_per_s: float

    @property
    def memory_bytes(self) -> int:
        """Nominal memory in bytes (decimal GB)."""
        return round(self.memory_gb * GB)


GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec("H100 SXM 80GB", memory_gb=80, bf16_tflops=989, hbm_tb_per_s=3.35),
    "h200": GpuSpec("H200 SXM 141GB", memory_gb=141, bf16_tflops=989, hbm_tb_per_s=4.8),
    "a100-80gb": GpuSpec("A100 SXM 80GB", memory_gb=80, bf16_tflops=312, hbm_tb_per_s=2.039),
    "a100-40gb": GpuSpec("A100 SXM 40GB", memory_gb=40, bf16_tflops=312, hbm_tb_per_s=1.555),
    "l40s": GpuSpec("L40S 48GB", memory_gb=48, bf16_tflops=362, hbm_tb_per_s=0.864),
    "mi300x": GpuSpec("MI300X 192GB", memory_gb=192, bf16_tflops=1307, hbm_tb_per_s=5.3),
}


def get_gpu(name: str) -> GpuSpec:
    """The spec named ``name`` (case-insensitive); ConfigError listing the known ones."""
    spec = GPUS.get(name.strip().lower())
    if spec is None:
        raise ConfigError(f"unknown GPU {name!r}; choose one of: {', '.join(GPUS)}", param="gpu")
    return spec
