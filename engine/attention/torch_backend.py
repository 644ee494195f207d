"""Paged attention in plain PyTorch: the reference backend and the CPU production path.

Every step first scatters the new K/V into the layer's block-major cache, then attends. Three
shapes of work take three routes, each a few large torch ops so CPU decode stays cheap:

* **decode** (every ``query_len == 1``): one padded gather of all context blocks through the
  block tables, a length mask, and one batched SDPA where each KV head's query group plays the
  role of "query positions" (GQA without repeating K/V);
* **prefill with no cached context** (``query_len == seq_len``): SDPA over the new K/V directly
  with ``is_causal=True`` — the cache is not read back;
* **prefill over a cached prefix / a chunk of a long prompt**: gather the context and apply a
  causal mask shifted by the prefix length.

No ``.item()`` / ``.tolist()`` on the hot path: per-sequence loops use the metadata's Python
mirrors. The index tensors that depend only on the step (slot split, decode mask) are built once
per step and reused by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention.backend import register_backend
from engine.attention.metadata import AttentionMetadata
from engine.kv.quantized_rows import is_quantized, pack_rows, unpack_rows


def write_kv_cache(
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim]
    k: torch.Tensor,  # [T, num_kv_heads, head_dim]
    v: torch.Tensor,  # [T, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [T] int64, block_id * block_size + offset
    block_size: int,
) -> None:
    """Scatter the new tokens' K and V into their slots (works on the strided layer view)."""
    _scatter(kv_cache, k, v, slot_mapping // block_size, slot_mapping % block_size)


def _scatter(
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim]
    k: torch.Tensor,  # [T, num_kv_heads, head_dim]
    v: torch.Tensor,  # [T, num_kv_heads, head_dim]
    block_ids: torch.Tensor,  # [T]
    offsets: torch.Tensor,  # [T]
) -> None:
    # NOTE: the block dim cannot be flattened into slots on a strided view, so index 2-D.
    if is_quantized(kv_cache):  # 8-bit rows: values then their float16 scale
        kv_cache[block_ids, 0, offsets] = pack_rows(k, kv_cache.dtype)
        kv_cache[block_ids, 1, offsets] = pack_rows(v, kv_cache.dtype)
        return
    kv_cache[block_ids, 0, offsets] = k.to(kv_cache.dtype)
    kv_cache[block_ids, 1, offsets] = v.to(kv_cache.dtype)


def gather_context(
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim]
    block_ids: torch.Tensor,  # [..., num_ctx_blocks] int
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of the listed blocks with tokens flattened: each ``[..., nb * bs, Hkv, D]``; an
    8-bit cache is dequantized into ``dtype``."""
    _, _, block_size, num_kv_heads, row = kv_cache.shape
    shape = (*block_ids.shape[:-1], block_ids.shape[-1] * block_size, num_kv_heads, row)
    flat_ids = block_ids.reshape(-1)  # [n * nb]
    # index_select on each half yields contiguous copies, so the token flatten is a free view.
    keys = kv_cache[:, 0].index_select(0, flat_ids).view(shape)
    values = kv_cache[:, 1].index_select(0, flat_ids).view(shape)
    if is_quantized(kv_cache):
        out_dtype = dtype or torch.float32
        return unpack_rows(keys, out_dtype), unpack_rows(values, out_dtype)
    return keys, values


@dataclass(frozen=True)
class _StepIndex:
    """Index tensors derived from one step's metadata, shared by all layers of the step."""

    slot_blocks: torch.Tensor  # [T]
    slot_offsets: torch.Tensor  # [T]
    decode_mask: torch.Tensor | None  # [B, 1, 1, S] bool; None when no padding is needed

    @classmethod
    def build(cls, meta: AttentionMetadata) -> _StepIndex:
        mask = None
        if meta.decode_only and min(meta.seq_lens_list) != meta.max_seq_len:
            positions = torch.arange(meta.max_seq_len, device=meta.seq_lens.device)  # [S]
            mask = (positions[None, :] < meta.seq_lens[:, None])[:, None, None, :]
        return cls(
            slot_blocks=meta.slot_mapping // meta.block_size,
            slot_offsets=meta.slot_mapping % meta.block_size,
            decode_mask=mask,
        )


class TorchAttentionBackend:
    """Paged attention with torch ops only (SDPA); correct on any device, fast on CPU."""

    name = "torch"
    supports_cuda_graphs = False  # sizes its gathers from the metadata's host lists

    def __init__(self) -> None:
        self._step_meta: AttentionMetadata | None = None
        self._step_index: _StepIndex | None = None

    def forward(
        self,
        q: torch.Tensor,  # [T, num_heads, head_dim]
        k: torch.Tensor,  # [T, num_kv_heads, head_dim]
        v: torch.Tensor,  # [T, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:  # [T, num_heads, head_dim]
        """Write the new K/V at ``meta.slot_mapping``, then attend causally over each context
        (within the last ``window`` positions when given)."""
        index = self._index_for(meta)
        _scatter(kv_cache, k, v, index.slot_blocks, index.slot_offsets)
        if meta.num_seqs == 0:
            return torch.empty_like(q)
        if meta.decode_only:
            mask = index.decode_mask
            if window is not None and window < meta.max_seq_len:
                mask = _decode_window_mask(meta, window)
            return self._decode(q, kv_cache, meta, mask, scale)
        if is_quantized(kv_cache):  # attend over what the cache holds, as a later hit will
            k = unpack_rows(pack_rows(k, kv_cache.dtype), q.dtype)
            v = unpack_rows(pack_rows(v, kv_cache.dtype), q.dtype)
        return self._prefill(q, k, v, kv_cache, meta, scale, window)

    def _index_for(self, meta: AttentionMetadata) -> _StepIndex:
        # NOTE: keyed by identity — the runner builds one metadata object per step.
        if meta is not self._step_meta or self._step_index is None:
            self._step_index = _StepIndex.build(meta)
            self._step_meta = meta
        return self._step_index

    def _decode(
        self,
        q: torch.Tensor,  # [B, Hq, D]
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        mask: torch.Tensor | None,  # [B, 1, 1, S]
        scale: float,
    ) -> torch.Tensor:  # [B, Hq, D]
        num_seqs, num_heads, head_dim = q.shape
        num_kv_heads = kv_cache.shape[3]
        max_seq_len = meta.max_seq_len
        num_ctx_blocks = -(-max_seq_len // meta.block_size)
        table = meta.block_tables[:, :num_ctx_blocks]  # [B, nb]
        keys, values = gather_context(kv_cache, table, q.dtype)  # [B, nb * bs, Hkv, D]
        keys, values = keys[:, :max_seq_len], values[:, :max_seq_len]  # [B, S, Hkv, D]
        # GQA: the query heads of one kv head are its "query positions"; no K/V repeat needed.
        q_grouped = q.reshape(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
        out = F.scaled_dot_product_attention(
            q_grouped,  # [B, Hkv, G, D]
            keys.transpose(1, 2),  # [B, Hkv, S, D]
            values.transpose(1, 2),
            attn_mask=mask,
            scale=scale,
        )  # [B, Hkv, G, D]
        return out.reshape(num_seqs, num_heads, head_dim)

    def _prefill(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int | None,
    ) -> torch.Tensor:  # [T, Hq, D]
        out = torch.empty_like(q)
        start = 0
        for seq_idx, (query_len, seq_len) in enumerate(
            zip(meta.query_lens_list, meta.seq_lens_list, strict=True)
        ):
            end = start + query_len
            if query_len == 0:
                continue
            q_seq = q[start:end].transpose(0, 1)  # [Hq, Tq, D]
            windowed = window is not None and window < seq_len
            if query_len == seq_len and not windowed:
                out_seq = _sdpa_gqa(q_seq, k[start:end], v[start:end], None, scale)
            else:
                if query_len == seq_len:  # fresh, but windowed: the new K/V are the context
                    keys, values = k[start:end], v[start:end]
                else:
                    num_ctx_blocks = -(-seq_len // meta.block_size)
                    table = meta.block_tables[seq_idx, :num_ctx_blocks]  # [nb]
                    keys, values = gather_context(kv_cache, table, q.dtype)  # [nb * bs, Hkv, D]
                key_pos = torch.arange(seq_len, device=q.device)  # [S]
                query_pos = key_pos[seq_len - query_len :]  # [Tq]
                mask = key_pos[None, :] <= query_pos[:, None]  # [Tq, S]
                if window is not None and windowed:
                    mask &= key_pos[None, :] > query_pos[:, None] - window
                out_seq = _sdpa_gqa(q_seq, keys[:seq_len], values[:seq_len], mask, scale)
            out[start:end] = out_seq.transpose(0, 1)
            start = end
        return out


def is_fresh_prompts(meta: AttentionMetadata, window: int | None) -> bool:
    """True for a prefill step of whole prompts with nothing cached before them (every
    ``query_len == seq_len``), none longer than a sliding ``window``."""
    return (
        not meta.decode_only
        and meta.query_lens_list == meta.seq_lens_list
        and (window is None or window >= meta.max_seq_len)
    )


def attend_fresh_prompts(
    q: torch.Tensor,  # [T, Hq, D]
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, num_kv_heads, head_dim], written
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:  # [T, Hq, D]
    """Causal attention of a :func:`is_fresh_prompts` step: per prompt, its K/V read back from
    the cache (an 8-bit cache is attended as stored, as a later prefix hit will be) and one
    causal SDPA — FlashAttention-class kernels on CUDA, tuned for the GPU by their authors."""
    out = torch.empty_like(q)
    start = 0
    for seq_idx, seq_len in enumerate(meta.seq_lens_list):
        end = start + seq_len
        table = meta.block_tables[seq_idx, : -(-seq_len // meta.block_size)]  # [nb]
        keys, values = gather_context(kv_cache, table, q.dtype)  # [nb * bs, Hkv, D]
        q_seq = q[start:end].transpose(0, 1)  # [Hq, L, D]
        out_seq = _sdpa_gqa(q_seq, keys[:seq_len], values[:seq_len], None, scale)
        out[start:end] = out_seq.transpose(0, 1)
        start = end
    return out


def _decode_window_mask(meta: AttentionMetadata, window: int) -> torch.Tensor:
    """[B, 1, 1, S]: key ``k`` of a sequence of length ``L`` is visible iff ``L - window <= k < L``
    (the new token sits at ``L - 1``)."""
    positions = torch.arange(meta.max_seq_len, device=meta.seq_lens.device)  # [S]
    lens = meta.seq_lens[:, None]
    return ((positions[None, :] < lens) & (positions[None, :] >= lens - window))[:, None, None, :]


def _sdpa_gqa(
    q: torch.Tensor,  # [Hq, Tq, D]
    k: torch.Tensor,  # [S, Hkv, D]
    v: torch.Tensor,  # [S, Hkv, D]
    mask: torch.Tensor | None,  # [Tq, S] bool, None = causal with Tq == S
    scale: float,
) -> torch.Tensor:  # [Hq, Tq, D]
    """SDPA for one sequence; GQA/MQA by repeating each kv head for its query group.

    NOTE: on CPU, ``enable_gqa=True`` (and 3-D inputs) send SDPA to the math kernel, which
    materialises the [Hq, Tq, S] scores — 2 GiB per layer for a 2K chunk over a 32K context.
    Repeated 4-D K/V keep it on the flash kernel (blockwise, with the mask), ~6x faster.
    """
    group = q.shape[0] // k.shape[1]
    keys = k.transpose(0, 1)  # [Hkv, S, D]
    values = v.transpose(0, 1)
    if group > 1:
        keys = keys.repeat_interleave(group, dim=0)  # [Hq, S, D]
        values = values.repeat_interleave(group, dim=0)
    out = F.scaled_dot_product_attention(
        q[None],  # [1, Hq, Tq, D]
        keys[None],
        values[None],
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
    )  # [1, Hq, Tq, D]
    return out[0]


register_backend("torch", TorchAttentionBackend)
