"""Assembles an engine's parts from config: checkpoint, device, dtype, model, tokenizer, KV.

The one place that decides the device (CUDA when present), the ``auto`` dtype (fp32 on CPU,
bf16 on CUDA), the attention backend (Triton on CUDA, the torch reference on CPU), the decode
batch sizes captured as CUDA graphs (on CUDA unless ``enforce_eager`` or ``enable_lora``;
never on CPU), the LoRA adapter manager, which
projections ``quantization: int8`` quantizes, the KV budget and the effective ``max_model_len``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from core import env
from core.config import EngineConfig, ModelConfig, SpeculativeConfig
from core.errors import ConfigError
from core.kv_events import KVEventBatch
from core.kv_layout import KVLayout
from engine.attention import get_backend
from engine.builtin import resolve_model
from engine.cuda_graphs import graph_batch_sizes, moe_syncs_host
from engine.draft_proposer import DraftTarget
from engine.kv.quantized_rows import KV_CACHE_DTYPES, SCALE_BYTES
from engine.kv.storage import TORCH_DTYPES, KVStorage, kv_budget_bytes, num_blocks_for_budget
from engine.kv.tiers.device_rows import DeviceRows
from engine.kv.tiers.store import KVTiers
from engine.loader import load_model
from engine.lora import LoRAManager, ServedBase
from engine.models import CausalLM, ModelArchConfig, MoELayer
from engine.models.layers import Linear
from engine.models.tp_shard import TPShard
from engine.scheduler import Scheduler
from engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineParts:
    """Everything an :class:`~engine.engine.LLMEngine` runs on."""

    model_dir: Path
    arch: ModelArchConfig
    model: CausalLM
    tokenizer: Tokenizer
    storage: KVStorage
    scheduler: Scheduler
    layout: KVLayout
    eos_token_ids: tuple[int, ...]
    seed: int
    compiled: bool = False
    cuda_graph_batch_sizes: tuple[int, ...] = ()  # empty: every step runs eagerly (or compiled)
    speculative: SpeculativeConfig | None = None  # None: the engine never drafts
    lora: LoRAManager | None = None  # the adapters (enable_lora), attached to the model


def draft_target(parts: EngineParts) -> DraftTarget:
    """What a draft model must match of ``parts`` (vocabulary) and sizes its KV from."""
    return DraftTarget(
        vocab_size=parts.arch.vocab_size,
        device=parts.storage.device,
        dtype=next(parts.model.parameters()).dtype,
        block_size=parts.layout.block_size,
        num_blocks=parts.storage.num_blocks,
        max_num_seqs=parts.scheduler.max_num_seqs,
        hash_seed=parts.layout.hash_seed,
    )


def pick_device(index: int = 0) -> torch.device:
    """CUDA device ``index`` (a tensor-parallel rank's own GPU) when CUDA is available, else the
    CPU."""
    return torch.device("cuda", index) if torch.cuda.is_available() else torch.device("cpu")


def resolve_dtype(name: str, device: torch.device) -> str:
    """``auto`` -> fp32 on CPU (bf16 SDPA decode is slow there), bf16 on CUDA."""
    if name == "auto":
        return "bfloat16" if device.type == "cuda" else "float32"
    return name


def overlaps_steps(engine_cfg: EngineConfig, device: torch.device) -> bool:
    """``engine.async_scheduling`` resolved: auto overlaps steps on CUDA only (a
    tensor-parallel gang too: rank 0 shares each step's pending sampled ids over the model's
    collective, on the device). A speculating engine never overlaps (auto: off): its drafts
    are proposed on the host from the last accepted token, which an overlapped step would only
    learn one step later."""
    if engine_cfg.speculative is not None:
        return False
    if engine_cfg.async_scheduling == "auto":
        return device.type == "cuda"
    return engine_cfg.async_scheduling == "on"


def model_id_of(name: str, model_dir: Path) -> str:
    """``name`` plus a digest of ``config.json``: two different checkpoints never share KV."""
    digest = hashlib.blake2b((model_dir / "config.json").read_bytes(), digest_size=6).hexdigest()
    return f"{name}@{digest}"


def build_engine_parts(
    model_cfg: ModelConfig,
    engine_cfg: EngineConfig,
    *,
    kv_event_callback: Callable[[KVEventBatch], None] | None = None,
    expert_ids: Sequence[int] | None = None,
    shared_kv: bool = False,
    tp: TPShard | None = None,
) -> EngineParts:
    """Load the model and size the KV cache as the configs say (``shared_kv``: its host bytes
    in named shared memory, for same-node pulls; ``tp``: one rank of a tensor-parallel gang,
    which loads its slices of the weights and holds its share of the KV heads)."""
    if (tp.size if tp is not None else 1) != engine_cfg.tensor_parallel_size:
        raise ConfigError(
            f"tensor_parallel_size is {engine_cfg.tensor_parallel_size} but this engine is "
            f"{'not a rank of a gang' if tp is None else f'a rank of a gang of {tp.size}'}",
            param="tensor_parallel_size",
        )
    threads = env.num_threads()
    if threads:
        torch.set_num_threads(threads)
    model_dir = resolve_model(model_cfg.name)
    arch = ModelArchConfig.from_dir(model_dir)
    max_model_len = _max_model_len(engine_cfg, arch)
    device = pick_device(tp.rank if tp is not None else 0)
    dtype = resolve_dtype(model_cfg.dtype, device)
    kv_dtype, scale_bytes = dtype, 0
    if engine_cfg.kv_cache_dtype != "auto":
        kv_dtype, scale_bytes = KV_CACHE_DTYPES[engine_cfg.kv_cache_dtype], SCALE_BYTES
    backend = get_backend("triton" if device.type == "cuda" else "torch")
    torch.manual_seed(model_cfg.seed)
    model = load_model(
        model_dir,
        dtype=TORCH_DTYPES[dtype],
        device=device,
        attn_backend=backend,
        expert_ids=expert_ids,
        tp=tp,
    )
    if model_cfg.quantization == "int8":
        quantize_model_int8(model)
    lora = _lora_manager(model_cfg, engine_cfg, model, model_dir, expert_ids is not None)
    tokenizer = Tokenizer.from_dir(model_dir)
    layout = arch.kv_layout(
        model_id_of(model_cfg.name, model_dir),
        kv_dtype,
        engine_cfg.block_size,
        engine_cfg.hash_seed,
        scale_bytes,
        tp=tp,
    )
    weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    budget = kv_budget_bytes(
        device, engine_cfg.kv_cache_memory_bytes, engine_cfg.kv_cache_memory_fraction, weights_bytes
    )
    storage = KVStorage(layout, num_blocks_for_budget(layout, budget), device, shared=shared_kv)
    tiered = engine_cfg.kv_tiers.host is not None or engine_cfg.kv_tiers.disk is not None
    # rank 0 holds the tiers of a whole gang (the other ranks' rows join once it formed)
    rows = DeviceRows(storage.block_bytes_view(), tp.size if tp is not None else 1)
    tiers = (
        KVTiers(engine_cfg.kv_tiers, layout, rows)
        if tiered and (tp is None or tp.rank == 0)
        else None
    )
    scheduler = Scheduler(
        engine_cfg,
        storage.num_blocks,
        max_model_len=max_model_len,
        kv_event_callback=kv_event_callback,
        tiers=tiers,
        sliding_window=arch.sliding_window if arch.all_layers_windowed else None,
        async_scheduling=overlaps_steps(engine_cfg, device),
    )
    eos_ids = tuple(dict.fromkeys(tokenizer.eos_token_ids + arch.eos_token_ids))
    graph_sizes = graph_batch_sizes(
        engine_cfg.cuda_graph_batch_sizes,
        max_num_seqs=engine_cfg.max_num_seqs,
        enforce_eager=engine_cfg.enforce_eager or lora is not None,
        on_cuda=device.type == "cuda",
        backend_supports_graphs=backend.supports_cuda_graphs,
        moe_syncs_host=moe_syncs_host(
            is_moe=arch.is_moe,
            fused_kernels=model.kernels.fused,
            expert_parallel=expert_ids is not None,
        ),
    )
    return EngineParts(
        model_dir,
        arch,
        model,
        tokenizer,
        storage,
        scheduler,
        layout,
        eos_ids,
        model_cfg.seed,
        compiled=engine_cfg.compile_model,
        cuda_graph_batch_sizes=graph_sizes,
        speculative=engine_cfg.speculative,
        lora=lora,
    )


def _lora_manager(
    model_cfg: ModelConfig,
    engine_cfg: EngineConfig,
    model: CausalLM,
    model_dir: Path,
    expert_parallel: bool,
) -> LoRAManager | None:
    """The adapter manager when ``enable_lora`` (its slots attached to ``model``'s linears).
    Steps with adapters run eagerly: the per-step slot mapping is not part of a CUDA graph."""
    if not engine_cfg.enable_lora:
        return None
    if expert_parallel:
        raise ConfigError(
            "enable_lora cannot be combined with expert parallelism yet", param="enable_lora"
        )
    return LoRAManager(
        model,
        max_loras=engine_cfg.max_loras,
        max_cpu_loras=engine_cfg.num_cpu_loras,
        max_lora_rank=engine_cfg.max_lora_rank,
        served=ServedBase(model_cfg.name, model_dir),
    )


def quantize_model_int8(model: nn.Module) -> int:
    """Quantize every eligible projection of ``model`` in place (weight-only int8, each layer
    through its own ``quantize_int8``); returns how many weight tensors.

    Left in the model dtype: embeddings, the LM head (its logits decide every token) and the
    MoE router gates (a changed expert choice changes the whole token), all small next to the
    projections.
    """
    skip = _full_precision_linears(model)
    count = 0
    for module in model.modules():
        if isinstance(module, Linear) and id(module) not in skip:
            module.quantize_int8()
            count += 1
        elif isinstance(module, MoELayer):
            count += module.quantize_int8()
    logger.info("int8 weight-only quantization: %d weight tensors", count)
    return count


def _full_precision_linears(model: nn.Module) -> set[int]:
    """Ids of the linears that stay in the model dtype: the LM head and router gates."""
    keep: set[int] = set()
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("lm_head", "gate", "shared_expert_gate"):
            keep.add(id(module))
    return keep


def _max_model_len(engine_cfg: EngineConfig, arch: ModelArchConfig) -> int:
    limit = arch.max_model_len
    if engine_cfg.max_model_len is None:
        return limit
    if engine_cfg.max_model_len > limit:
        raise ConfigError(
            f"max_model_len={engine_cfg.max_model_len} exceeds the model's limit of {limit} "
            "positions",
            param="max_model_len",
        )
    return engine_cfg.max_model_len
