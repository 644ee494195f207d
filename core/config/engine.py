"""Model and engine sections: which checkpoint, and how the engine runs it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from core.config.base import DType, StrictModel
from core.config.kv_tiers import KVTiersConfig
from core.config.lora import LoRAModuleConfig
from core.config.speculative import SpeculativeConfig

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The adapter ranks ``max_lora_rank`` may name (vLLM's list)."""


class EngineConfig(StrictModel):
    """Options of the inference engine that both roles run."""

    max_model_len: int | None = Field(
        None, ge=1, description="Longest prompt + output in tokens; default: the model's limit."
    )
    block_size: int = Field(16, ge=1, le=1024, description="Tokens per KV block.")
    kv_cache_dtype: Literal["auto", "fp8_e4m3", "int8"] = Field(
        "auto",
        description="KV cache element type: auto (the model dtype) or 8-bit (fp8_e4m3, int8) "
        "with a float16 scale per token, layer, K/V and head; halves KV memory and transfer "
        "bytes against bf16. Prefill and decode must agree (the layout fingerprint checks).",
    )
    kv_cache_memory_bytes: int | None = Field(
        None, ge=1, description="Bytes of KV storage; overrides kv_cache_memory_fraction."
    )
    kv_cache_memory_fraction: float = Field(
        0.9, gt=0.0, le=1.0, description="Fraction of free device memory for KV on GPU."
    )
    max_num_batched_tokens: int = Field(
        2048, ge=1, description="Token budget of one engine step (chunked prefill splits prompts)."
    )
    long_prefill_token_threshold: int | None = Field(
        None,
        ge=1,
        description="Most prompt tokens one request may prefill in a step; the rest of the "
        "step's budget stays open to other requests (short prompts keep flowing while a long "
        "one prefills). None: a prompt may take the whole budget (vLLM's option of this name).",
    )
    max_num_seqs: int = Field(64, ge=1, description="Most requests running at once.")
    enable_prefix_caching: bool = Field(True, description="Reuse cached full prompt blocks.")
    hash_seed: int = Field(
        0,
        ge=-(2**63),
        lt=2**63,
        description="Seed of the chained prefix-block hashes (core.hashing, blake2b-64). The "
        "engines' prefix caches, the routers and the KV index all hash with it; it is part of "
        "the KV layout fingerprint, so prefill and decode must agree.",
    )
    compile_model: bool = Field(
        False,
        description="Run the model through torch.compile (attention stays an opaque op): "
        "fused kernels, fewer ops per step; compiles while the engine is built (seconds to a "
        "minute, cached on disk). Not with expert_parallel > 1.",
    )
    enforce_eager: bool = Field(
        False,
        description="Never replay CUDA graphs: every decode step launches its kernels one by "
        "one. Graphs are only ever used on CUDA; on a CPU every step runs eagerly anyway.",
    )
    cuda_graph_batch_sizes: tuple[int, ...] | None = Field(
        None,
        description="Decode batch sizes captured as CUDA graphs while the engine is built; a "
        "decode step of B requests replays the smallest size >= B with padding rows. Default: "
        "1, 2, 4 and every multiple of 8 up to max_num_seqs. Prefill steps, larger batches and "
        "MoE models run eagerly (or compiled).",
    )

    async_scheduling: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Overlap steps: the host schedules and prepares step N+1 while the device "
        "runs step N; sampled token ids stay on the device and the host reads them one step "
        "later (a request that ends may compute one extra token, never emitted). Batches that "
        "need the previous token on the host (structured output, penalties) and the last "
        "step of a prefill-only request run synchronously. auto: on for CUDA, off on a CPU "
        "(nothing to overlap there). A speculating engine never overlaps: auto resolves to "
        "off and on is refused (a draft needs the last accepted token on the host).",
    )

    speculative: SpeculativeConfig | None = Field(
        None,
        description="Speculative decoding (vLLM's speculative_config): draft tokens per "
        "running request and verify them in the next step. None: off. Not yet with "
        "tensor_parallel_size > 1.",
    )

    tensor_parallel_size: int = Field(
        1,
        ge=1,
        description="Ranks one replica's model is split over (Megatron layout: attention heads, "
        "MLP width and vocabulary; one all-reduce per attention and per MLP). Rank 0 schedules "
        "and owns the KV manager; every rank holds its own heads' KV. Must divide the attention "
        "heads and the MLP width (MoE: every expert's width); KV heads are split, or replicated "
        "when fewer than ranks. KV tiers hold every rank's share of a block (CPU only for now). "
        "Not yet with compile_model.",
    )

    # -- multi-LoRA (vLLM's option names) --------------------------------------------------
    enable_lora: bool = Field(
        False,
        description="Serve PEFT LoRA adapters on top of the base model: a request may name an "
        "adapter, and requests of different adapters (and the base) share a batch. Not with "
        "tensor_parallel_size > 1, compile_model or MoE layers' experts (attention only there).",
    )
    max_loras: int = Field(
        1, ge=1, description="Adapters held on the device at once (one batch uses at most these)."
    )
    max_lora_rank: int = Field(
        16,
        description="Largest adapter rank accepted; sizes each device slot. One of vLLM's "
        f"allowed ranks: {', '.join(map(str, LORA_RANKS))}.",
    )
    max_cpu_loras: int | None = Field(
        None,
        ge=1,
        description="Adapters kept loaded in host memory (least recently used evicted); must be "
        ">= max_loras. None: max_loras.",
    )

    kv_tiers: KVTiersConfig = Field(
        default_factory=KVTiersConfig,
        description="Host-RAM and disk tiers under the prefix cache, and idle TTLs per tier.",
    )

    @model_validator(mode="after")
    def _budget_fits_block(self) -> EngineConfig:
        if self.max_num_batched_tokens < self.block_size:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"block_size ({self.block_size})"
            )
        return self

    @model_validator(mode="after")
    def _speculation_without_overlap(self) -> EngineConfig:
        if self.speculative is not None and self.async_scheduling == "on":
            raise ValueError(
                "async_scheduling 'on' cannot be combined with speculative decoding (drafts "
                "need the last accepted token on the host): use 'auto' or 'off'"
            )
        return self

    @model_validator(mode="after")
    def _tensor_parallel_combinations(self) -> EngineConfig:
        size = self.tensor_parallel_size
        if size == 1:
            return self
        refused = {
            "compile_model": self.compile_model,
            # NOTE: followers rebuild each step from a broadcast that carries no drafts yet
            "speculative decoding": self.speculative is not None,
        }
        for name, present in refused.items():
            if present:
                raise ValueError(
                    f"tensor_parallel_size ({size}) cannot be combined with {name} yet"
                )
        return self

    @model_validator(mode="after")
    def _lora_limits(self) -> EngineConfig:
        if self.max_lora_rank not in LORA_RANKS:
            raise ValueError(
                f"max_lora_rank ({self.max_lora_rank}) must be one of {list(LORA_RANKS)}"
            )
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})"
            )
        if self.enable_lora and self.tensor_parallel_size > 1:
            raise ValueError("enable_lora cannot be combined with tensor_parallel_size > 1 yet")
        if self.enable_lora and self.compile_model:
            raise ValueError("enable_lora cannot be combined with compile_model yet")
        return self

    @property
    def num_cpu_loras(self) -> int:
        """Host slots for adapters: ``max_cpu_loras``, or ``max_loras`` when unset."""
        return self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras

    @model_validator(mode="after")
    def _graph_sizes_fit(self) -> EngineConfig:
        sizes = self.cuda_graph_batch_sizes
        if sizes is None:
            return self
        if not sizes:
            raise ValueError("cuda_graph_batch_sizes must not be empty (use enforce_eager: true)")
        if min(sizes) < 1 or max(sizes) > self.max_num_seqs:
            raise ValueError(
                f"cuda_graph_batch_sizes {list(sizes)} must lie in 1..max_num_seqs "
                f"({self.max_num_seqs})"
            )
        if list(sizes) != sorted(set(sizes)):
            raise ValueError(f"cuda_graph_batch_sizes {list(sizes)} must be strictly increasing")
        return self


class ModelConfig(StrictModel):
    """Which model to serve and how to load it."""

    name: str = Field(..., description="A built-in name (builtin:tiny-moe) or a local HF dir.")
    dtype: DType = Field("auto", description="Weights/KV dtype; auto: fp32 on CPU, bf16 on GPU.")
    seed: int = Field(0, description="Seed for built-in weights and default sampling.")
    served_name: str | None = Field(None, description="Name clients use; default: name.")
    quantization: Literal["int8"] | None = Field(
        None,
        description="Weight-only quantization at load: int8 stores attention, MLP and expert "
        "projections as int8 with a scale per output channel (embeddings, LM head and router "
        "gates stay in dtype). None: weights as loaded. Pre-quantized checkpoints are refused.",
    )
    lora_modules: tuple[LoRAModuleConfig, ...] = Field(
        (),
        description="LoRA adapters both pools load at start, each served under its name "
        "(vLLM's --lora-modules); needs engine.enable_lora. More load at run time through "
        "POST /v1/load_lora_adapter.",
    )
