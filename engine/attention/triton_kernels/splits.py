"""How many pieces the decode kernel cuts each context into (split-KV, "flash-decoding").

A decode step has one query token per sequence, so the natural grid — one program per
(sequence, kv head) — is tiny at small batch sizes: batch 1 of an 8-kv-head model runs 8 programs
on a GPU with 132 SMs, each walking the whole context alone. Splitting every context into
``num_splits`` ranges multiplies the programs; a second small kernel merges the partial results.

The count depends only on the batch size, the kv heads and the GPU — never on sequence lengths —
so one captured CUDA graph (fixed grid) stays valid while its sequences grow; each program reads
its sequence's length at run time and derives its own token range from it.
"""

from __future__ import annotations

import torch

from engine.triton_launch import INTERPRETER, cuda_target

MAX_SPLITS = 64  # bounds the merge kernel's tile and the scratch buffers
INTERPRETER_SM_COUNT = INTERPRETER.num_sms


def choose_num_splits(num_seqs: int, num_kv_heads: int, num_sms: int) -> int:
    """The most splits that keep the decode grid within one wave of ``num_sms`` programs.

    1 when the batch alone fills the GPU (``num_seqs * num_kv_heads >= num_sms``): no split, no
    merge. Otherwise ``num_sms // (num_seqs * num_kv_heads)``, at most :data:`MAX_SPLITS`.
    """
    if num_seqs < 1 or num_kv_heads < 1 or num_sms < 1:
        raise ValueError(
            f"need positive counts (num_seqs={num_seqs}, num_kv_heads={num_kv_heads}, "
            f"num_sms={num_sms})"
        )
    programs = num_seqs * num_kv_heads
    return max(1, min(MAX_SPLITS, num_sms // programs))


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device``; :data:`INTERPRETER_SM_COUNT` off CUDA."""
    if device.type != "cuda":
        return INTERPRETER_SM_COUNT
    return cuda_target(device).num_sms
