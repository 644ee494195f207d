"""A replica's KV compatibility: the :class:`~core.kv_compat.KVCompat` its engine's KV carries.

Built once per replica from the engine it booted: the checkpoint's revision (a content hash of
the weights and config, cached beside them; weight-only quantization at load marks it, since
quantized weights compute other KV), the unsplit KV layout (block size, KV dtype, heads, the
block-hash algorithm — tensor-parallel gangs of any size exchange KV head by head, so the split
is part of the pull plan, not of the fingerprint), the block-hash seed and the speculative
settings that add KV of their own (a draft model's; the draft-free methods keep only the
target's). Both roles pass it to their transport (a pull across fingerprints is refused) and
publish its fingerprint in their stats.
"""

from __future__ import annotations

from core.config import EngineConfig, ModelConfig, SpeculativeConfig
from core.kv_compat import KVCompat
from engine.checkpoint import checkpoint_revision
from engine.setup import EngineParts


def replica_kv_compat(parts: EngineParts, model: ModelConfig, engine: EngineConfig) -> KVCompat:
    """The compatibility of the KV an engine built from ``parts`` computes."""
    revision = checkpoint_revision(parts.model_dir)
    if model.quantization is not None:
        revision = f"{revision}+{model.quantization}"
    return KVCompat(
        model_revision=revision,
        layout=parts.layout.unsplit().fingerprint(),
        hash_seed=engine.hash_seed,
        speculative=speculative_kv(engine.speculative),
    )


def speculative_kv(config: SpeculativeConfig | None) -> str:
    """What speculative decoding adds to a replica's KV ("" when nothing: off, or draft-free)."""
    if config is None or config.method != "draft_model":
        return ""
    return f"draft_model:{config.model}:k={config.num_speculative_tokens}"
