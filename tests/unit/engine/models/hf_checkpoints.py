"""Tiny random HF checkpoints built with ``transformers`` itself, and a greedy loop for our model.

Reusable by any test that needs a real HF-layout checkpoint plus the HF model as reference::

    from tests.unit.engine.models.hf_checkpoints import PRESETS, save_checkpoint, greedy_generate

    ckpt = save_checkpoint("qwen2-moe", tmp_path)  # config.json + model.safetensors
    ckpt.hf_model  # the transformers model holding the very same weights (fp32, eval)

``PRESETS`` names one small config per family and shape feature (GQA ratios, MQA, tied
embeddings, odd head dims, llama3/linear RoPE scaling, QKV bias, MoE with a shared expert,
sparse-step and mlp-only layers, q/k norm). Weights are re-drawn from a seeded generator with
larger-than-default scales so that logits are decisive (fewer greedy near-ties) and norm weights
differ from one. ``eos_token_id`` is unset so generation always runs ``max_new_tokens``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from engine.attention.backend import AttentionBackend, get_backend
from engine.attention.metadata import AttentionMetadata
from engine.builtin.byte_tokenizer import byte_to_char_map
from engine.models.decoder import CausalLM

transformers.utils.logging.disable_progress_bar()

_BASE: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}


def _cfg(cls: type[PretrainedConfig], **overrides: Any) -> Callable[[], PretrainedConfig]:
    return lambda: cls(**{**_BASE, **overrides})


_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

PRESETS: dict[str, Callable[[], PretrainedConfig]] = {
    # Llama 2 style: GQA 4:2, untied.
    "llama": _cfg(LlamaConfig),
    # Llama 3.x style: llama3 RoPE scaling, tied embeddings, GQA 8:2, odd head dim 24.
    "llama3": _cfg(
        LlamaConfig,
        num_attention_heads=8,
        head_dim=24,
        tie_word_embeddings=True,
        rope_parameters=_LLAMA3_ROPE,
        num_hidden_layers=3,
    ),
    # MQA (1 kv head) with attention bias on q/k/v/o and linear RoPE scaling.
    "llama-mqa": _cfg(
        LlamaConfig,
        num_key_value_heads=1,
        attention_bias=True,
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    ),
    # Mistral: head dim 40 (q width 160 != hidden 64), GQA 4:2, a sliding window.
    "mistral": _cfg(MistralConfig, head_dim=40, sliding_window=256),
    # Mistral with a window far shorter than the prompts: real sliding-window attention.
    "mistral-swa": _cfg(MistralConfig, head_dim=40, sliding_window=24),
    # Qwen2: QKV bias, MQA, tied embeddings.
    "qwen2": _cfg(Qwen2Config, num_key_value_heads=1, tie_word_embeddings=True),
    # Mixtral: 4 experts, top-2, renormalised.
    "mixtral": _cfg(
        MixtralConfig, num_local_experts=4, num_experts_per_tok=2, intermediate_size=48
    ),
    # Qwen2-MoE: shared expert + sigmoid gate, 8 experts top-2, un-normalised top-k, layer 1
    # dense (mlp_only_layers).
    "qwen2-moe": _cfg(
        Qwen2MoeConfig,
        num_hidden_layers=3,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        norm_topk_prob=False,
        mlp_only_layers=[1],
    ),
    # Qwen2-MoE with decoder_sparse_step=2 (layers 1 and 3 MoE), top-3, normalised top-k.
    "qwen2-moe-sparse": _cfg(
        Qwen2MoeConfig,
        num_hidden_layers=4,
        num_experts=6,
        num_experts_per_tok=3,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        norm_topk_prob=True,
        decoder_sparse_step=2,
    ),
    # Qwen3-MoE: q/k norm, head dim 32 (q width 128), no shared expert, normalised top-k.
    "qwen3-moe": _cfg(
        Qwen3MoeConfig,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
    ),
}

MODEL_CLASSES: dict[type[PretrainedConfig], type[PreTrainedModel]] = {
    LlamaConfig: LlamaForCausalLM,
    MistralConfig: MistralForCausalLM,
    Qwen2Config: Qwen2ForCausalLM,
    MixtralConfig: MixtralForCausalLM,
    Qwen2MoeConfig: Qwen2MoeForCausalLM,
    Qwen3MoeConfig: Qwen3MoeForCausalLM,
}
DENSE_PRESETS = ("llama", "llama3", "llama-mqa", "mistral", "qwen2")
MOE_PRESETS = ("mixtral", "qwen2-moe", "qwen2-moe-sparse", "qwen3-moe")


@dataclass(frozen=True)
class HFCheckpoint:
    """A checkpoint directory and the transformers model whose weights it holds."""

    preset: str
    path: Path
    hf_model: PreTrainedModel


def build_hf_model(preset: str, seed: int = 0) -> PreTrainedModel:
    """The transformers model of ``preset`` with seeded, decisive random weights (fp32, eval)."""
    config = PRESETS[preset]()
    model = MODEL_CLASSES[type(config)](config).eval()
    randomize_weights(model, seed)
    return model


def save_checkpoint(
    preset: str,
    directory: Path,
    *,
    seed: int = 0,
    max_shard_size: str | None = None,
    original_format: bool = True,
) -> HFCheckpoint:
    """Write ``preset`` to ``directory`` with ``save_pretrained`` (safetensors).

    ``max_shard_size`` (e.g. ``"20KB"``) makes a sharded checkpoint with an index json;
    ``original_format=False`` keeps transformers' fused MoE expert tensors.
    """
    model = build_hf_model(preset, seed)
    kwargs: dict[str, Any] = {"save_original_format": original_format}
    if max_shard_size is not None:
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(directory, **kwargs)
    return HFCheckpoint(preset, Path(directory), model)


def randomize_weights(model: torch.nn.Module, seed: int) -> None:
    """Redraw every parameter from ``seed``.

    Norm weights ~ 1 + 0.1 N, biases ~ 0.1 N, matrices ~ N / sqrt(fan_in) (fan_in = last dim,
    stacked expert tensors too), embeddings ~ 0.2 N: small next to the layers' outputs, so tied
    models do not merely echo their input token.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                value = 1.0 + 0.1 * noise
            elif param.dim() == 1:
                value = 0.1 * noise
            elif "embed_tokens" in name:
                value = 0.2 * noise
            else:
                value = noise / math.sqrt(param.shape[-1])
            param.copy_(value)


@torch.no_grad()
def hf_greedy(
    hf_model: PreTrainedModel, prompt: Sequence[int], max_new_tokens: int
) -> tuple[list[int], torch.Tensor]:
    """HF ``generate(do_sample=False)``: (new token ids, per-step logits [N, vocab] float32)."""
    out = hf_model.generate(
        torch.tensor([list(prompt)]),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    new_tokens = out.sequences[0, len(prompt) :].tolist()
    return new_tokens, torch.cat(out.logits).float()


def new_kv_cache(model: CausalLM, num_blocks: int, block_size: int) -> torch.Tensor:
    """A zeroed block-major cache [num_blocks, layers, 2, block_size, kv_heads, head_dim]."""
    return torch.zeros(model.kv_cache_shape(num_blocks, block_size), dtype=model.dtype)


@torch.no_grad()
def greedy_generate(
    model: CausalLM,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    block_size: int = 8,
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy-decode every prompt at once through our model.

    One flattened prefill step for all prompts, then one decode step per token for the whole
    batch. Sequence ``i`` owns blocks ``i, i + B, i + 2B, ...`` (interleaved, so a wrong block
    table reads another sequence's KV). Returns per prompt the new token ids and the logits
    [max_new_tokens, vocab] float32 that chose them.
    """
    num_seqs = len(prompts)
    blocks_per_seq = -(-(max(map(len, prompts)) + max_new_tokens) // block_size)
    tables = [[i + j * num_seqs for j in range(blocks_per_seq)] for i in range(num_seqs)]
    kv_cache = new_kv_cache(model, num_seqs * blocks_per_seq, block_size)
    lens = [len(p) for p in prompts]
    ids = torch.tensor([t for p in prompts for t in p])
    positions = torch.cat([torch.arange(n) for n in lens])
    meta = AttentionMetadata.build(lens, lens, tables, block_size)
    last = torch.tensor(lens).cumsum(0) - 1  # [B] index of each prompt's last token
    tokens: list[list[int]] = [[] for _ in prompts]
    logits_steps: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        hidden = model(ids, positions, kv_cache, meta)  # [T, H]
        logits = model.compute_logits(hidden[last])  # [B, V]
        logits_steps.append(logits)
        ids = logits.argmax(dim=-1)  # [B]
        for seq_tokens, token in zip(tokens, ids.tolist(), strict=True):
            seq_tokens.append(token)
        positions = torch.tensor(lens) + step  # [B]
        seq_lens = [n + step + 1 for n in lens]
        meta = AttentionMetadata.build([1] * num_seqs, seq_lens, tables, block_size)
        last = torch.arange(num_seqs)
    stacked = torch.stack(logits_steps, dim=1)  # [B, N, V]
    return tokens, list(stacked)


def torch_backend() -> AttentionBackend:
    """The registered ``torch`` attention backend."""
    import engine.attention.torch_backend  # noqa: F401  (registers "torch")

    return get_backend("torch")


def assert_greedy_matches(
    ours: Sequence[int],
    our_logits: torch.Tensor,  # [N, V]
    theirs: Sequence[int],
    their_logits: torch.Tensor,  # [N, V]
    *,
    tie_margin: float = 1e-4,
    atol: float = 1e-4,
) -> None:
    """Token-identical greedy output, except that sequences may part at a genuine near-tie.

    Up to the first differing token the step logits must match; at that step HF's top-2 logits
    must be within ``tie_margin`` of each other (float noise decides), and nothing after it is
    compared (the continuations condition on different tokens).
    """
    assert len(ours) == len(theirs)
    for step, (mine, hf_token) in enumerate(zip(ours, theirs, strict=True)):
        torch.testing.assert_close(our_logits[step], their_logits[step], atol=atol, rtol=1e-4)
        if mine != hf_token:
            gap = float(their_logits[step, hf_token] - their_logits[step, mine])
            assert gap <= tie_margin, (
                f"step {step}: ours {mine} vs HF {hf_token}, HF logit gap {gap} is no near-tie"
            )
            return


def add_byte_tokenizer(directory: Path) -> None:
    """Write ``tokenizer.json`` (256 byte tokens, no merges) and an empty tokenizer config, so
    the engine can load a transformers-built checkpoint (vocab 256)."""
    vocab = {char: byte for byte, char in byte_to_char_map().items()}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({}))
