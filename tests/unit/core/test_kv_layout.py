"""KV layout arithmetic and the fingerprint check."""

from __future__ import annotations

import pytest

from core.errors import LayoutMismatchError
from core.kv_layout import KVLayout


def layout(**overrides: object) -> KVLayout:
    fields: dict[str, object] = {
        "model_id": "m",
        "dtype": "bfloat16",
        "block_size": 16,
        "num_layers": 28,
        "num_kv_heads": 4,
        "head_dim": 128,
        "hash_seed": 0,
    }
    fields.update(overrides)
    return KVLayout(**fields)  # type: ignore[arg-type]


def test_bytes_per_token_matches_the_formula() -> None:
    # Qwen2.5-7B: 2 x 28 layers x 4 kv heads x 128 dims x 2 bytes = 57,344 bytes per token.
    assert layout().bytes_per_token == 57_344
    assert layout().block_bytes == 57_344 * 16


def test_mismatch_names_every_differing_field() -> None:
    a, b = layout(), layout(dtype="float16", block_size=32)
    assert a.fingerprint() != b.fingerprint()
    assert a.fingerprint() == layout().fingerprint()
    with pytest.raises(LayoutMismatchError) as info:
        a.check_compatible(b)
    assert "dtype" in info.value.message and "block_size" in info.value.message
    a.check_compatible(layout())
