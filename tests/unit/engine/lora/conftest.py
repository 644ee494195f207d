"""Fixtures for the LoRA tests: one tiny Llama checkpoint (transformers-built, saved once) and
PEFT adapters of it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.unit.engine.lora.peft_adapters import MadeAdapter, make_adapter
from tests.unit.engine.models.hf_checkpoints import (
    HFCheckpoint,
    add_byte_tokenizer,
    save_checkpoint,
)

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="session")
def llama(tmp_path_factory: pytest.TempPathFactory) -> HFCheckpoint:
    """The ``llama`` preset (GQA 4:2, 2 layers) saved with a byte tokenizer and a chat
    template."""
    saved = save_checkpoint("llama", tmp_path_factory.mktemp("lora-llama"))
    add_byte_tokenizer(saved.path)
    (saved.path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}))
    return saved


@pytest.fixture(scope="session")
def adapters(
    llama: HFCheckpoint, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., MadeAdapter]:
    """``adapters(seed, **options)``: a PEFT adapter of ``llama``, made once per options."""
    cache: dict[tuple[object, ...], MadeAdapter] = {}

    def get(seed: int, **options: object) -> MadeAdapter:
        key = (seed, *sorted(options.items()))
        if key not in cache:
            directory: Path = tmp_path_factory.mktemp(f"adapter-{seed}")
            cache[key] = make_adapter(llama.hf_model, directory, seed=seed, **options)  # type: ignore[arg-type]
        return cache[key]

    return get
