"""LoRA on an MoE model: attention adapters match peft (Qwen2-MoE, QKV bias, a dense layer);
an adapter of the experts' or the shared expert's projections is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import LoRATargetError
from engine import LLM, LoRARequest, SamplingParams
from tests.unit.engine.lora.peft_adapters import make_adapter
from tests.unit.engine.models.hf_checkpoints import (
    HFCheckpoint,
    add_byte_tokenizer,
    hf_greedy,
    save_checkpoint,
)

GREEDY_12 = SamplingParams(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def qwen2_moe(tmp_path_factory: pytest.TempPathFactory) -> HFCheckpoint:
    saved = save_checkpoint("qwen2-moe", tmp_path_factory.mktemp("lora-qwen2-moe"))
    add_byte_tokenizer(saved.path)
    return saved


def test_attention_adapter_matches_peft(qwen2_moe: HFCheckpoint, tmp_path: Path) -> None:
    made = make_adapter(
        qwen2_moe.hf_model, tmp_path / "a", seed=4, targets=("q_proj", "k_proj", "v_proj", "o_proj")
    )
    llm = LLM(str(qwen2_moe.path), block_size=8, enable_lora=True)
    prompts = [[5, 9, 200, 17, 3], list(range(40, 61))]
    outs = llm.generate(
        prompt_token_ids=prompts,
        sampling_params=GREEDY_12,
        lora_request=LoRARequest("attn", 1, str(made.path)),
        use_tqdm=False,
    )
    theirs = [hf_greedy(made.peft_model, p, 12)[0] for p in prompts]
    assert [list(o.outputs[0].token_ids) for o in outs] == theirs
    assert theirs != [hf_greedy(qwen2_moe.hf_model, p, 12)[0] for p in prompts]


def test_mlp_adapter_refused_on_moe(qwen2_moe: HFCheckpoint, tmp_path: Path) -> None:
    made = make_adapter(qwen2_moe.hf_model, tmp_path / "a", seed=4, targets=("gate_proj",))
    llm = LLM(str(qwen2_moe.path), block_size=8, enable_lora=True)
    with pytest.raises(LoRATargetError, match="targets a module pdserve cannot adapt"):
        llm.generate(
            prompt_token_ids=[[1, 2, 3]],
            sampling_params=GREEDY_12,
            lora_request=LoRARequest("mlp", 1, str(made.path)),
        )
