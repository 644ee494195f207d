"""GGUF files written by the tests from HF checkpoints, the way llama.cpp's converter writes them.

``write_gguf(checkpoint_dir, path, qtype_of)`` writes the checkpoint's metadata under the GGUF
keys, its tensors under the names ``gguf``'s own ``TensorNameMap`` gives (experts stacked into
``[E, rows, cols]``, Q/K rows permuted for ``llama`` as ``convert_hf_to_gguf.py`` does), each
quantized to ``qtype_of(hf_name, tensor)`` with ``gguf``'s quantizers. The K-quants, which
``gguf`` only dequantizes, are written as random valid blocks instead of the weights. The
returned ``expected`` holds, per HF name, what the file holds in HF order — the tensor as
quantized and dequantized again — which the loader must give back exactly.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

Q = gguf.GGMLQuantizationType
QUANTIZABLE = (Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0)
_ARCHS = {
    "LlamaForCausalLM": "llama",
    "MixtralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2moe",
    "Qwen3MoeForCausalLM": "qwen3moe",
}
_EXPERT = re.compile(r"\.experts\.(\d+)\.")
QTypeOf = Callable[[str, np.ndarray], "gguf.GGMLQuantizationType"]


@dataclass(frozen=True)
class WrittenGGUF:
    """A GGUF file and what its tensors hold, per HF name, in HF order (float32)."""

    path: Path
    expected: dict[str, torch.Tensor]
    qtypes: dict[str, gguf.GGMLQuantizationType]  # per GGUF tensor name


def f32_everywhere(name: str, values: np.ndarray) -> gguf.GGMLQuantizationType:
    """Store every tensor as F32 (an exact copy of the checkpoint)."""
    return Q.F32


def quantized(qtype: gguf.GGMLQuantizationType) -> QTypeOf:
    """``qtype`` for every matrix whose rows split into its blocks, F32 for the rest."""

    def pick(name: str, values: np.ndarray) -> gguf.GGMLQuantizationType:
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        return qtype if values.ndim >= 2 and values.shape[-1] % block == 0 else Q.F32

    return pick


def write_gguf(
    checkpoint: Path,
    path: Path,
    qtype_of: QTypeOf,
    *,
    seed: int = 0,
    tokenizer: bool = True,
    extra_tensors: dict[str, np.ndarray] | None = None,
) -> WrittenGGUF:
    """Write the HF checkpoint in ``checkpoint`` as the GGUF file ``path`` (``tokenizer``: with
    its vocabulary; ``extra_tensors``: more tensors, F32, under their GGUF names)."""
    config = json.loads((checkpoint / "config.json").read_text())
    config = {**config, **config.get("text_config", {})}
    arch = _ARCHS[config["architectures"][0]]
    writer = gguf.GGUFWriter(path, arch)
    _write_metadata(writer, config, arch)
    if tokenizer:
        _write_tokenizer(writer, checkpoint)
    rng = np.random.default_rng(seed)
    expected: dict[str, torch.Tensor] = {}
    qtypes: dict[str, gguf.GGMLQuantizationType] = {}
    names = gguf.get_tensor_name_map(_arch_id(arch), config["num_hidden_layers"])
    for hf_base, members in _grouped(load_file(checkpoint / "model.safetensors")).items():
        gguf_name = _gguf_name(names, hf_base)
        values = np.stack([m.float().numpy() for _, m in members]) if len(members) > 1 else \
            members[0][1].float().numpy()  # fmt: skip
        if gguf_name.endswith("ffn_gate_inp_shexp.weight"):
            values = values.reshape(-1)  # llama.cpp stores the shared expert's gate as [H]
        qtype = qtype_of(hf_base, values)
        raw, held = _encode(values, qtype, rng)
        if arch == "llama" and re.search(r"\.attn_[qk]\.", gguf_name):
            raw = _permute(raw, config, gguf_name)  # per-row blocks: permuting bytes is exact
        writer.add_tensor(gguf_name, raw, raw_dtype=None if raw.dtype != np.uint8 else qtype)
        qtypes[gguf_name] = qtype
        for index, (hf_name, member) in enumerate(members):
            part = held[index] if len(members) > 1 else held
            expected[hf_name] = torch.from_numpy(np.ascontiguousarray(part)).reshape(member.shape)
    for name, values in (extra_tensors or {}).items():
        writer.add_tensor(name, values.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return WrittenGGUF(path, expected, qtypes)


def _arch_id(arch: str) -> gguf.MODEL_ARCH:
    return next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == arch)


def _grouped(tensors: dict[str, torch.Tensor]) -> dict[str, list[tuple[str, torch.Tensor]]]:
    """HF names by the GGUF tensor they go into: the experts of one projection stacked."""
    groups: dict[str, list[tuple[str, torch.Tensor]]] = {}
    for name in sorted(tensors, key=lambda n: [int(p) if p.isdigit() else p for p in n.split(".")]):
        groups.setdefault(_EXPERT.sub(".experts.", name), []).append((name, tensors[name]))
    return groups


def _gguf_name(names: gguf.TensorNameMap, hf_name: str) -> str:
    found = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    assert found is not None, f"gguf has no name for {hf_name}"
    return found


def _encode(
    values: np.ndarray, qtype: gguf.GGMLQuantizationType, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(the bytes or array to write, what the file then holds as float32)."""
    if qtype not in QUANTIZABLE:
        block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        shape = (*values.shape[:-1], values.shape[-1] // block_values * block_bytes)
        # bytes <= 0x3b keep every float16 scale finite and small
        raw = rng.integers(0, 0x3C, size=shape, dtype=np.uint8)
        return raw, gguf.dequantize(raw, qtype)
    if qtype == Q.F32:
        return values.astype(np.float32), values.astype(np.float32)
    raw = gguf.quantize(values, qtype)
    return raw, gguf.dequantize(raw, qtype).astype(np.float32)


def _permute(raw: np.ndarray, config: dict[str, Any], gguf_name: str) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute`` of the q (k) rows."""
    heads = config["num_attention_heads"]
    if ".attn_k." in gguf_name:
        heads = config.get("num_key_value_heads") or heads
    rows = raw.shape[0]
    split = raw.reshape(heads, 2, rows // heads // 2, *raw.shape[1:])
    return np.ascontiguousarray(split.swapaxes(1, 2).reshape(raw.shape))


def _write_metadata(writer: gguf.GGUFWriter, config: dict[str, Any], arch: str) -> None:
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.get("num_key_value_heads") or heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    rope = config.get("rope_parameters") or {}
    writer.add_rope_freq_base(rope.get("rope_theta") or config.get("rope_theta") or 10000.0)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    experts = config.get("num_experts") or config.get("num_local_experts")
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config["num_experts_per_tok"])
    if config.get("moe_intermediate_size"):
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if config.get("shared_expert_intermediate_size"):
        writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])


def _write_tokenizer(writer: gguf.GGUFWriter, checkpoint: Path) -> None:
    """The checkpoint's byte-level tokenizer as a ``gpt2`` GGUF vocabulary."""
    backend = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    vocab = backend.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.__getitem__)
    special = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in special else 1 for t in tokens])
    writer.add_token_scores([0.0] * len(tokens))  # no merges: transformers derives none
    tokenizer_config = json.loads((checkpoint / "tokenizer_config.json").read_text())
    generation = checkpoint / "generation_config.json"
    eos = json.loads(generation.read_text()).get("eos_token_id") if generation.exists() else None
    if tokenizer_config.get("bos_token"):
        writer.add_bos_token_id(vocab[tokenizer_config["bos_token"]])
    if tokenizer_config.get("eos_token"):
        writer.add_eos_token_id(vocab[tokenizer_config["eos_token"]])
    elif isinstance(eos, list) and eos:
        writer.add_eos_token_id(eos[0])
    writer.add_add_bos_token(bool(tokenizer_config.get("add_bos_token")))
    if tokenizer_config.get("chat_template"):
        writer.add_chat_template(tokenizer_config["chat_template"])
