"""The mid-size built-in for GPU numbers: its shape and size, from the spec alone.

Its weights (2.2 GB) are never written here; only the config arithmetic is checked.
"""

from __future__ import annotations

from engine.builtin import builtin_model_names
from engine.builtin.specs import BUILTIN_SPECS, TINY_SPECS
from engine.builtin.weights import num_parameters, tensor_shapes
from engine.models import ModelArchConfig

SPEC = BUILTIN_SPECS["llama-1b"]


def test_llama_1b_is_listed_but_never_tiny() -> None:
    assert "builtin:llama-1b" in builtin_model_names()
    assert not SPEC.tiny and "llama-1b" not in TINY_SPECS
    assert set(TINY_SPECS) == {"tiny-llama", "tiny-moe"}


def test_llama_1b_shape() -> None:
    arch = ModelArchConfig.from_hf_dict(SPEC.config)
    assert (arch.hidden_size, arch.num_layers, arch.vocab_size) == (2048, 16, 32000)
    assert (arch.num_heads, arch.num_kv_heads, arch.head_dim) == (32, 8, 64)
    assert arch.intermediate_size == 8192
    assert not arch.is_moe and not arch.tie_word_embeddings
    assert SPEC.config["torch_dtype"] == "bfloat16"


def test_llama_1b_parameter_count() -> None:
    hidden, layers, vocab, inter = 2048, 16, 32000, 8192
    q_dim, kv_dim = 32 * 64, 8 * 64
    per_layer = (
        hidden * q_dim  # q_proj
        + 2 * hidden * kv_dim  # k_proj, v_proj
        + q_dim * hidden  # o_proj
        + 3 * hidden * inter  # gate, up, down
        + 2 * hidden  # the two norms
    )
    expected = 2 * vocab * hidden + layers * per_layer + hidden  # embed, lm_head, final norm
    assert num_parameters(SPEC.config) == expected == 1_104_218_112
    assert len(tensor_shapes(SPEC.config)) == 2 + 16 * 9 + 1
    assert 2 * expected / 2**30 < 2.1  # bf16 bytes: fits any GPU with room for KV
