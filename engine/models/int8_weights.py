"""Weight-only int8 math: per-output-channel scales, and the int8 weight-only matmul.

A weight [out, in] becomes an int8 ``q`` [out, in] plus a scale per output channel ``s`` [out]
(``s = amax(|W_row|) / 127``, ``q = round(W / s)``), halving (bf16) or quartering (fp32) its
bytes; decode, which streams every weight once per step, reads that much less memory.
``y = (x @ q.T) * s``: on CPU and CUDA through torch's int8 weight-only matmul
(``torch._weight_int8pack_mm``, with activations in bfloat16 or float16; a float32 model's
activations are rounded to bfloat16 for it) wherever a probe finds it runs, else by
dequantizing into the model dtype. Scales are kept in float32. A leaf: the layers that hold
int8 weights (``Linear``, ``MoELayer``) quantize themselves with these functions.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

INT8_MAX = 127.0


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [..., out, in] -> (int8 [..., out, in], float32 scales [..., out])."""
    w = weight.float()
    scales = (w.abs().amax(dim=-1) / INT8_MAX).clamp(min=1e-12)
    q = torch.round(w / scales[..., None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scales


def int8_linear(
    x: torch.Tensor, weight_q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x`` [..., in] through int8 ``weight_q`` [out, in] with ``scales`` [out]; the result
    is in ``x``'s dtype. The kernel takes half-precision activations: float32 ones go through
    it in bfloat16 (its float32 path is several times slower than the float32 matmul)."""
    flat = x.reshape(-1, x.shape[-1])
    if has_int8_kernel(x.device):
        compute = x.dtype if x.dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
        out = torch._weight_int8pack_mm(flat.to(compute), weight_q, scales.to(compute))
        out = out.to(x.dtype)
    else:  # no int8 kernel here: dequantize (correct, not faster)
        out = F.linear(flat, weight_q.to(x.dtype) * scales.to(x.dtype)[:, None])
    out = out.reshape(*x.shape[:-1], weight_q.shape[0])
    return out if bias is None else out + bias


_KERNEL_ON: dict[str, bool] = {}


def has_int8_kernel(device: torch.device) -> bool:
    """Whether ``torch._weight_int8pack_mm`` runs on this kind of device (probed once with a
    tiny matmul; a build without it falls back to dequantizing, with a warning)."""
    kind = device.type
    if kind not in _KERNEL_ON:
        try:
            x = torch.ones(1, 32, dtype=torch.bfloat16, device=device)
            w = torch.ones(8, 32, dtype=torch.int8, device=device)
            torch._weight_int8pack_mm(x, w, torch.ones(8, dtype=torch.bfloat16, device=device))
            _KERNEL_ON[kind] = True
        except (RuntimeError, NotImplementedError) as e:
            logger.warning("no int8 weight-only kernel on %s (%s): dequantizing instead", kind, e)
            _KERNEL_ON[kind] = False
    return _KERNEL_ON[kind]
