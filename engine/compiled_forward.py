"""The model forward through ``torch.compile`` (``EngineConfig.compile_model``).

Eager, one decode step of a small model is a couple of hundred torch ops whose dispatch costs
as much as their arithmetic on a CPU. Compiled, inductor fuses the norms, RoPE, residual adds and
the gated MLP's activation into generated kernels around the matmuls; attention stays the opaque
``pdserve::paged_attention`` op (see :mod:`engine.attention.opaque`), so host-side metadata never
enters the graph and one graph serves every step: the token count is a dynamic dimension (one
extra specialisation for a single token), compiled by :meth:`CompiledForward.warm_up` when the
engine is built and cached by inductor on disk.

Wrapping a model gives each of its layers an :class:`~engine.attention.opaque.OpaqueAttention`
backend: from then on the model runs only through :class:`CompiledForward`.
"""

from __future__ import annotations

import logging
import time
from typing import cast

import torch

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.attention.opaque import OpaqueAttention, attention_step
from engine.models import CausalLM
from engine.models.attention import Attention

logger = logging.getLogger(__name__)

_NO_META = cast(AttentionMetadata, None)  # the op reads the step's metadata from its context


class CompiledForward:
    """``logits = forward(input_ids, positions, kv_cache, meta, sample_rows)``, compiled."""

    def __init__(self, model: CausalLM) -> None:
        self.model = model
        attentions = [cast(Attention, layer.self_attn) for layer in model.layers]
        self.backend: AttentionBackend = attentions[0].backend
        for layer_idx, attention in enumerate(attentions):
            attention.backend = OpaqueAttention(layer_idx)
        self._compiled = torch.compile(self._forward, dynamic=True)

    def __call__(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_cache: torch.Tensor,  # [num_blocks, L, 2, block_size, Hkv, D]
        meta: AttentionMetadata,
        sample_rows: torch.Tensor,  # [S] int64, S >= 1
    ) -> torch.Tensor:  # [S, vocab] float32
        """Run the step (writing its K/V) and return the logits of ``sample_rows``."""
        with attention_step(self.backend, kv_cache, meta):
            return cast(torch.Tensor, self._compiled(input_ids, positions, kv_cache, sample_rows))

    @torch.inference_mode()
    def warm_up(self, kv_cache: torch.Tensor, block_size: int) -> None:
        """Compile every graph now (a replica is ready only once compiled): one token, several
        tokens with one sampled row, several with several. Writes only the padding block 0.

        The inputs are made in inference mode, as the engine's steps make theirs: the graphs
        guard on the inputs' dispatch keys, so tensors made outside it would compile graphs
        the steps never use and leave the steps to compile their own."""
        start = time.perf_counter()
        device = kv_cache.device
        for num_tokens, num_rows in ((1, 1), (2, 1), (2, 2)):
            table = [0] * -(-num_tokens // block_size)
            meta = AttentionMetadata.build([num_tokens], [num_tokens], [table], block_size, device)
            ids = torch.zeros(num_tokens, dtype=torch.long, device=device)
            positions = torch.arange(num_tokens, device=device)
            rows = torch.arange(num_rows, device=device)
            self(ids, positions, kv_cache, meta, rows)
        logger.info("model compiled in %.1f s", time.perf_counter() - start)

    def _forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        sample_rows: torch.Tensor,
    ) -> torch.Tensor:
        hidden = self.model(input_ids, positions, kv_cache, _NO_META)  # [T, H]
        return self.model.compute_logits(hidden.index_select(0, sample_rows))
