"""Tensor-parallel models on the CPU: every rank a thread holding only its slices, the
collectives between them in process. TP=2 and TP=4 must decode what TP=1 decodes, for GQA, MQA
(KV heads replicated), biases, tied embeddings, odd head dims, sliding windows and MoE layers
(every expert's width split over the ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from core.errors import ConfigError
from engine.expert_parallel.thread_collective import InProcGroup
from engine.loader import load_model
from engine.models import CausalLM, ModelArchConfig
from engine.models.tp_shard import TPShard
from engine.models.tp_split import check_tensor_parallel
from tests.unit.engine.gangs.tp_prompts import NEW_TOKENS, PROMPTS
from tests.unit.engine.models.hf_checkpoints import (
    greedy_generate,
    save_checkpoint,
    torch_backend,
)

REPO_ROOT = Path(__file__).resolve().parents[4]


def load_rank(path: Path, shard: TPShard | None) -> CausalLM:
    return load_model(
        path, dtype=torch.float32, device="cpu", attn_backend=torch_backend(), tp=shard
    )


def decode_on_ranks(path: Path, size: int) -> list[tuple[list[list[int]], list[torch.Tensor]]]:
    group = InProcGroup(size, timeout_s=60.0)

    def rank(r: int) -> tuple[list[list[int]], list[torch.Tensor]]:
        model = load_rank(path, TPShard(r, size, group.member(r)))
        return greedy_generate(model, PROMPTS, NEW_TOKENS)

    with ThreadPoolExecutor(size) as pool:
        return list(pool.map(rank, range(size)))


@pytest.mark.parametrize(
    ("preset", "sizes"),
    [
        ("llama", (2,)),  # GQA 4:2, untied, intermediate 64
        ("llama-mqa", (2, 4)),  # one KV head replicated on every rank, q/k/v/o biases
        ("qwen2", (2,)),  # qkv bias, tied embeddings (the vocabulary-sliced LM head)
        ("mistral-swa", (2,)),  # head dim 40, a sliding window shorter than the prompts
        ("mixtral", (2,)),  # every expert's width split over the ranks, per-expert tensors
        ("qwen2-moe", (2,)),  # routed and shared experts split, a dense layer between
        ("qwen3-moe", (2,)),  # q/k norms, no shared expert
    ],
)
def test_tp_decodes_what_one_rank_decodes(tmp_path: Path, preset: str, sizes: tuple[int, ...]):
    checkpoint = save_checkpoint(preset, tmp_path / preset)
    tokens, logits = greedy_generate(load_rank(checkpoint.path, None), PROMPTS, NEW_TOKENS)
    for size in sizes:
        for rank_tokens, rank_logits in decode_on_ranks(checkpoint.path, size):
            assert rank_tokens == tokens, (preset, size)
            for got, want in zip(rank_logits, logits, strict=True):
                torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_tp_splits_fused_expert_tensors_too(tmp_path: Path) -> None:
    """A checkpoint with every layer's experts in one ``experts.gate_up_proj`` tensor: each
    rank reads its gate rows and its up rows of every expert, and its down columns."""
    checkpoint = save_checkpoint("qwen2-moe", tmp_path / "fused", original_format=False)
    tokens, _ = greedy_generate(load_rank(checkpoint.path, None), PROMPTS, NEW_TOKENS)
    for rank_tokens, _ in decode_on_ranks(checkpoint.path, 2):
        assert rank_tokens == tokens


def test_a_rank_holds_only_its_slices(tmp_path: Path) -> None:
    checkpoint = save_checkpoint("llama", tmp_path / "llama")
    whole = load_rank(checkpoint.path, None)
    group = InProcGroup(2)
    half = load_rank(checkpoint.path, TPShard(1, 2, group.member(1)))
    attn, attn_half = whole.layers[0].self_attn, half.layers[0].self_attn
    assert attn_half.qkv_proj.weight.shape[0] * 2 == attn.qkv_proj.weight.shape[0]
    assert attn_half.o_proj.weight.shape[1] * 2 == attn.o_proj.weight.shape[1]
    # rank 1's query heads are the second half of q's rows, its KV head the second of k's
    head_dim, num_q = attn.head_dim, attn.num_heads
    q_half = attn.qkv_proj.weight[num_q // 2 * head_dim : num_q * head_dim]
    torch.testing.assert_close(attn_half.qkv_proj.weight[: num_q // 2 * head_dim], q_half)
    mlp, mlp_half = whole.layers[0].mlp, half.layers[0].mlp
    assert mlp_half.down_proj.weight.shape[1] * 2 == mlp.down_proj.weight.shape[1]
    assert half.embed_tokens.weight.shape[0] * 2 == whole.embed_tokens.weight.shape[0]
    params = sum(p.numel() for p in half.parameters())
    assert params < 0.6 * sum(p.numel() for p in whole.parameters())  # norms are replicated


def test_sizes_that_do_not_split_are_refused_naming_the_numbers() -> None:
    config = ModelArchConfig(
        architecture="LlamaForCausalLM",
        hidden_size=64,
        num_layers=1,
        num_heads=6,
        num_kv_heads=3,
        head_dim=16,
        intermediate_size=96,
        vocab_size=100,
        rope_theta=10000.0,
        rope_scaling=None,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        qkv_bias=False,
        o_bias=False,
        qk_norm=False,
        max_position_embeddings=128,
        bos_token_id=None,
        eos_token_ids=(),
    )
    check_tensor_parallel(config, 3)  # 6 heads, 3 KV heads, width 96: all split by 3
    with pytest.raises(ConfigError, match="does not divide the 6 attention heads"):
        check_tensor_parallel(config, 4)
    with pytest.raises(ConfigError, match="the 3 KV heads: one must divide the other"):
        check_tensor_parallel(config, 2)
    with pytest.raises(ConfigError, match=r"rank 2 outside 0\.\.1"):
        TPShard(2, 2, InProcGroup(2).member(0))


@pytest.mark.slow
def test_two_gloo_processes_decode_what_one_rank_decodes(tmp_path: Path) -> None:
    checkpoint = save_checkpoint("llama-mqa", tmp_path / "ckpt")
    tokens, _ = greedy_generate(load_rank(checkpoint.path, None), PROMPTS, NEW_TOKENS)
    init_method = f"file://{tmp_path / 'rendezvous'}"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "GLOO_SOCKET_IFNAME": "lo"}
    env["OMP_NUM_THREADS"] = "1"
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.unit.engine.gangs.tp_worker",
                str(checkpoint.path),
                init_method,
                str(r),
                "2",
                str(outs[r]),
            ],
            cwd=REPO_ROOT,
            env=env,
        )
        for r in range(2)
    ]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    assert [json.loads(out.read_text()) for out in outs] == [tokens, tokens]
