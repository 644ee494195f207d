"""Every way an adapter can be refused: one typed error each, and nothing of it loaded."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from core.errors import (
    InvalidRequestError,
    LoRAAdapterError,
    LoRABaseModelError,
    LoRAConfigError,
    LoRAFileError,
    LoRARankError,
    LoRATargetError,
)
from engine import LLM, LoRARequest, SamplingParams
from engine.lora import ServedBase, base_model_matches
from tests.unit.engine.lora.peft_adapters import MadeAdapter
from tests.unit.engine.models.hf_checkpoints import HFCheckpoint

GREEDY = SamplingParams(max_tokens=2, temperature=0.0)


@pytest.fixture(scope="module")
def llm(llama: HFCheckpoint) -> LLM:
    return LLM(str(llama.path), block_size=8, enable_lora=True, max_lora_rank=8)


def copy_adapter(made: MadeAdapter, tmp_path: Path) -> Path:
    target = tmp_path / "adapter"
    shutil.copytree(made.path, target)
    return target


def edit_config(adapter_dir: Path, **changes: object) -> None:
    path = adapter_dir / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def refused(llm: LLM, adapter_dir: Path, error: type[LoRAAdapterError], match: str) -> None:
    request = LoRARequest("bad", 7, str(adapter_dir))
    with pytest.raises(error, match=match) as raised:
        llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=GREEDY, lora_request=request)
    assert raised.value.param == "bad"
    assert raised.value.status_code == 400
    lora = llm.engine.parts.lora
    assert lora is not None and "bad" not in lora.residencies()  # nothing half-loaded
    assert not llm.engine.has_unfinished()


def test_rank_above_the_limit(llm: LLM, adapters: Callable[..., MadeAdapter]) -> None:
    refused(llm, adapters(1, rank=16).path, LoRARankError, "rank 16 exceeds max_lora_rank")


def test_targets_the_model_lacks(
    llm: LLM, adapters: Callable[..., MadeAdapter], tmp_path: Path
) -> None:
    adapter_dir = copy_adapter(adapters(1), tmp_path)
    edit_config(adapter_dir, target_modules=["q_proj", "lm_head"])
    refused(llm, adapter_dir, LoRATargetError, r"targets \['lm_head'\]")


def test_a_tensor_for_a_layer_the_model_lacks(
    llm: LLM, adapters: Callable[..., MadeAdapter], tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    adapter_dir = copy_adapter(adapters(1), tmp_path)
    weights_path = adapter_dir / "adapter_model.safetensors"
    tensors = load_file(str(weights_path))
    tensors = {key.replace("layers.1.", "layers.9."): value for key, value in tensors.items()}
    save_file(tensors, str(weights_path))
    refused(llm, adapter_dir, LoRATargetError, "layers.9.* targets a module the served model")


def test_another_base_model(llm: LLM, adapters: Callable[..., MadeAdapter], tmp_path: Path) -> None:
    adapter_dir = copy_adapter(adapters(1), tmp_path)
    edit_config(adapter_dir, base_model_name_or_path="meta-llama/Llama-3.1-8B")
    refused(llm, adapter_dir, LoRABaseModelError, "trained on 'meta-llama/Llama-3.1-8B'")


def test_the_base_model_match_rule(tmp_path: Path) -> None:
    model_dir = tmp_path / "Llama-3.1-8B"
    model_dir.mkdir()
    served = ServedBase(str(model_dir), model_dir)
    assert base_model_matches(None, served)
    assert base_model_matches(str(model_dir), served)
    assert base_model_matches("meta-llama/Llama-3.1-8B", served)  # hub id, same last part
    assert not base_model_matches("meta-llama/Llama-3.2-1B", served)
    assert base_model_matches("builtin:tiny-llama", ServedBase("builtin:tiny-llama", tmp_path))


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        ("truncate", "cannot read"),
        ("drop_weights", "no adapter_model.safetensors"),
        ("drop_config", "no adapter_config.json"),
        ("garble_config", "cannot read"),
        ("missing_dir", "no directory"),
        ("drop_b", r"lora_B has shape None"),
    ],
)
def test_missing_or_corrupt_files(
    damage: str,
    match: str,
    llm: LLM,
    adapters: Callable[..., MadeAdapter],
    tmp_path: Path,
) -> None:
    from safetensors.torch import load_file, save_file

    adapter_dir = copy_adapter(adapters(1), tmp_path)
    weights = adapter_dir / "adapter_model.safetensors"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:100])
    elif damage == "drop_weights":
        weights.unlink()
    elif damage == "drop_config":
        (adapter_dir / "adapter_config.json").unlink()
    elif damage == "garble_config":
        (adapter_dir / "adapter_config.json").write_text("{not json")
    elif damage == "missing_dir":
        shutil.rmtree(adapter_dir)
    else:
        tensors = load_file(str(weights))
        tensors = {k: v for k, v in tensors.items() if "0.self_attn.q_proj.lora_B" not in k}
        save_file(tensors, str(weights))
    refused(llm, adapter_dir, LoRAFileError, match)


@pytest.mark.parametrize(
    "changes",
    [
        {"bias": "all"},
        {"use_dora": True},
        {"modules_to_save": ["lm_head"]},
        {"rank_pattern": {"q_proj": 4}},
        {"peft_type": "IA3"},
    ],
)
def test_unsupported_configs(
    changes: dict[str, object],
    llm: LLM,
    adapters: Callable[..., MadeAdapter],
    tmp_path: Path,
) -> None:
    adapter_dir = copy_adapter(adapters(1), tmp_path)
    edit_config(adapter_dir, **changes)
    key = next(iter(changes))
    refused(llm, adapter_dir, LoRAConfigError, f"{key}=.* is not supported")


def test_one_bad_adapter_fails_the_whole_batch_before_queueing(
    llm: LLM, adapters: Callable[..., MadeAdapter]
) -> None:
    good = LoRARequest("good", 1, str(adapters(1).path))
    bad = LoRARequest("bad", 2, "/nonexistent/adapter")
    with pytest.raises(LoRAFileError):
        llm.generate(
            prompt_token_ids=[[1, 2], [3, 4]], sampling_params=GREEDY, lora_request=[good, bad]
        )
    assert not llm.engine.has_unfinished()


def test_requests_refused_without_enable_lora(
    llama: HFCheckpoint, adapters: Callable[..., MadeAdapter]
) -> None:
    plain = LLM(str(llama.path), block_size=8)
    request = LoRARequest("a", 1, str(adapters(1).path))
    with pytest.raises(InvalidRequestError, match="enable_lora is off"):
        plain.generate(prompt_token_ids=[[1, 2]], sampling_params=GREEDY, lora_request=request)


def test_a_list_must_name_one_adapter_per_prompt(llm: LLM) -> None:
    with pytest.raises(InvalidRequestError, match="2 entries for 3 prompts"):
        llm.generate(
            prompt_token_ids=[[1], [2], [3]], sampling_params=GREEDY, lora_request=[None, None]
        )


def test_lora_request_fields_are_checked() -> None:
    with pytest.raises(InvalidRequestError, match="lora_int_id must be >= 1"):
        LoRARequest("a", 0, "/x")
    with pytest.raises(InvalidRequestError, match="lora_name must not be empty"):
        LoRARequest("", 1, "/x")


def test_one_name_one_adapter(llm: LLM, adapters: Callable[..., MadeAdapter]) -> None:
    llm.engine.add_lora(LoRARequest("same", 3, str(adapters(1).path)))
    with pytest.raises(InvalidRequestError, match="unload it before loading"):
        llm.engine.add_lora(LoRARequest("same", 4, str(adapters(2).path)))
