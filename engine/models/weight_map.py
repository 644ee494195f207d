"""Checkpoint tensor names -> where they land in :class:`CausalLM`, per family (HF hub naming).

The model stacks some checkpoint tensors: q/k/v rows into ``qkv_proj``, gate/up rows into
``gate_up_proj``, and each expert into row ``local_id`` of the MoE layer's ``[E_local, ...]``
parameters. Both expert layouts are read: one tensor per expert (``experts.{e}.w1.weight``,
``experts.{e}.gate_proj.weight``; what every hub checkpoint and transformers' ``save_pretrained``
write) and fused 3-D tensors (``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj``
[E, H, I]; transformers' in-memory layout), from which only owned experts' rows are read.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from engine.models.config import ModelArchConfig
from engine.models.tp_shard import TPShard

# Checkpoint tensors that carry no weights (old checkpoints saved RoPE buffers).
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


@dataclass(frozen=True)
class WeightSlot:
    """One destination of a checkpoint tensor (or of one expert of a fused expert tensor)."""

    param: str  # qualified parameter name in CausalLM
    checkpoint_shape: tuple[int, ...]  # the whole checkpoint tensor's expected shape
    row_start: int = 0  # first destination row along the (expert-indexed) parameter's dim 0
    expert: int | None = None  # local expert index into the parameter's dim 0
    src_expert: int | None = None  # global expert index into the checkpoint tensor's dim 0
    src_dim: int = 0  # tensor parallelism: the checkpoint dim a rank's slice is cut along
    src_start: int = 0
    src_len: int | None = None  # None: the whole dim

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of what is copied: the checkpoint tensor, one expert of it, or a rank's slice."""
        shape = self.checkpoint_shape if self.src_expert is None else self.checkpoint_shape[1:]
        if self.src_len is None:
            return shape
        return (*shape[: self.src_dim], self.src_len, *shape[self.src_dim + 1 :])

    def source_index(self) -> tuple[int | slice, ...] | None:
        """The index into the checkpoint tensor of what is copied — one expert of a fused
        expert tensor, a rank's slice (``src_dim`` counts past the expert dim), or both; None
        for the whole tensor."""
        index: tuple[int | slice, ...] = () if self.src_expert is None else (self.src_expert,)
        if self.src_len is not None:
            cut = slice(self.src_start, self.src_start + self.src_len)
            index = (*index, *[slice(None)] * self.src_dim, cut)
        return index or None


@dataclass(frozen=True)
class WeightMap:
    """``expected`` names must be present; ``skipped`` names may be present and are not read."""

    expected: dict[str, list[WeightSlot]]
    skipped: frozenset[str]


def build_weight_map(
    config: ModelArchConfig,
    checkpoint_names: Collection[str] = (),
    expert_ids: Sequence[int] | None = None,
    tp: TPShard | None = None,
) -> WeightMap:
    """The weight map of ``config``; ``checkpoint_names`` selects the expert layout per layer
    (per-expert tensors unless the checkpoint holds fused ones), ``expert_ids`` the owned
    experts, ``tp`` the tensor-parallel rank whose slices are read (only those bytes).
    """
    hidden, vocab = config.hidden_size, config.vocab_size
    expected: dict[str, list[WeightSlot]] = {
        "model.embed_tokens.weight": [_vocab_slot("embed_tokens.weight", vocab, hidden, tp)],
        "model.norm.weight": [WeightSlot("norm.weight", (hidden,))],
    }
    skipped: set[str] = set()
    if config.tie_word_embeddings:
        skipped.add("lm_head.weight")
    else:
        expected["lm_head.weight"] = [_vocab_slot("lm_head.weight", vocab, hidden, tp)]
    owned = range(config.num_experts) if expert_ids is None else sorted(set(expert_ids))
    for i in range(config.num_layers):
        src, dst = f"model.layers.{i}", f"layers.{i}"
        for norm in ("input_layernorm", "post_attention_layernorm"):
            expected[f"{src}.{norm}.weight"] = [WeightSlot(f"{dst}.{norm}.weight", (hidden,))]
        expected.update(_attention(config, f"{src}.self_attn", f"{dst}.self_attn", tp, skipped))
        if config.is_moe_layer(i):
            block = _moe_block(config, src, checkpoint_names)
            expected.update(_moe(config, block, f"{dst}.mlp", checkpoint_names, owned, skipped, tp))
        else:
            expected.update(
                _gated_mlp(f"{src}.mlp", f"{dst}.mlp", hidden, config.intermediate_size, tp)
            )
    return WeightMap(expected, frozenset(skipped))


def canonical_checkpoint_shapes(config: ModelArchConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a hub-layout checkpoint of ``config`` holds, with its shape."""
    return {
        name: slots[0].checkpoint_shape for name, slots in build_weight_map(config).expected.items()
    }


def _vocab_slot(param: str, vocab: int, hidden: int, tp: TPShard | None) -> WeightSlot:
    """The embedding or LM head: whole, or this rank's vocabulary rows."""
    if tp is None:
        return WeightSlot(param, (vocab, hidden))
    first, count, _ = tp.vocab(vocab)
    return WeightSlot(param, (vocab, hidden), src_start=first, src_len=count)


def _attention(
    cfg: ModelArchConfig, src: str, dst: str, tp: TPShard | None, skipped: set[str]
) -> dict[str, list[WeightSlot]]:
    """q, k, v stacked into ``qkv_proj`` rows (a rank: its heads' rows of each), ``o_proj``
    (a rank: the columns of its query heads; its bias read by rank 0 only)."""
    hidden, head_dim = cfg.hidden_size, cfg.head_dim
    q_rows, kv_rows = cfg.num_heads * head_dim, cfg.num_kv_heads * head_dim
    q_first, num_q = (0, cfg.num_heads) if tp is None else tp.heads(cfg.num_heads)
    kv_first, num_kv = (0, cfg.num_kv_heads) if tp is None else tp.kv_heads(cfg.num_kv_heads)
    local_q, local_kv = num_q * head_dim, num_kv * head_dim
    out: dict[str, list[WeightSlot]] = {}
    for proj, rows, start, first, count in (
        ("q_proj", q_rows, 0, q_first, local_q),
        ("k_proj", kv_rows, local_q, kv_first, local_kv),
        ("v_proj", kv_rows, local_q + local_kv, kv_first, local_kv),
    ):
        cut = {} if tp is None else {"src_start": first * head_dim, "src_len": count}
        out[f"{src}.{proj}.weight"] = [
            WeightSlot(f"{dst}.qkv_proj.weight", (rows, hidden), start, **cut)
        ]
        if cfg.qkv_bias:
            out[f"{src}.{proj}.bias"] = [WeightSlot(f"{dst}.qkv_proj.bias", (rows,), start, **cut)]
    o_cut = (
        {} if tp is None else {"src_dim": 1, "src_start": q_first * head_dim, "src_len": local_q}
    )
    out[f"{src}.o_proj.weight"] = [WeightSlot(f"{dst}.o_proj.weight", (hidden, q_rows), **o_cut)]
    if cfg.o_bias and (tp is None or tp.rank == 0):
        out[f"{src}.o_proj.bias"] = [WeightSlot(f"{dst}.o_proj.bias", (hidden,))]
    elif cfg.o_bias:
        skipped.add(f"{src}.o_proj.bias")
    if cfg.qk_norm:
        for norm in ("q_norm", "k_norm"):
            out[f"{src}.{norm}.weight"] = [WeightSlot(f"{dst}.{norm}.weight", (head_dim,))]
    return out


def _gated_mlp(
    src: str, dst: str, hidden: int, inter: int, tp: TPShard | None = None
) -> dict[str, list[WeightSlot]]:
    """gate and up stacked into ``gate_up_proj`` rows, ``down_proj``; a tensor-parallel rank
    reads its share of the width: those rows of gate and up, those columns of down."""
    first, width = (0, inter) if tp is None else tp.split(inter)
    rows = {} if tp is None else {"src_start": first, "src_len": width}
    cols = {} if tp is None else {"src_dim": 1, "src_start": first, "src_len": width}
    gate_up, shape = f"{dst}.gate_up_proj.weight", (inter, hidden)
    return {
        f"{src}.gate_proj.weight": [WeightSlot(gate_up, shape, **rows)],
        f"{src}.up_proj.weight": [WeightSlot(gate_up, shape, width, **rows)],
        f"{src}.down_proj.weight": [WeightSlot(f"{dst}.down_proj.weight", (hidden, inter), **cols)],
    }


def _moe_block(cfg: ModelArchConfig, layer_src: str, names: Collection[str]) -> str:
    """The checkpoint module holding this layer's router + experts (Mixtral has two spellings)."""
    assert cfg.spec.moe is not None
    blocks = cfg.spec.moe.checkpoint_blocks
    found = (b for b in blocks if f"{layer_src}.{b}.gate.weight" in names)
    return f"{layer_src}.{next(found, blocks[0])}"


def _moe(
    cfg: ModelArchConfig,
    src: str,
    dst: str,
    names: Collection[str],
    owned: Sequence[int],
    skipped: set[str],
    tp: TPShard | None = None,
) -> dict[str, list[WeightSlot]]:
    """Router, optional shared expert and the owned experts; a tensor-parallel rank reads its
    share of every expert's width (gate/up rows, down columns), as of the shared expert's."""
    assert cfg.spec.moe is not None
    hidden, inter, num_experts = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts
    out = {f"{src}.gate.weight": [WeightSlot(f"{dst}.gate.weight", (num_experts, hidden))]}
    if cfg.shared_expert_intermediate_size > 0:
        shared_inter = cfg.shared_expert_intermediate_size
        out.update(
            _gated_mlp(f"{src}.shared_expert", f"{dst}.shared_expert", hidden, shared_inter, tp)
        )
        out[f"{src}.shared_expert_gate.weight"] = [
            WeightSlot(f"{dst}.shared_expert_gate.weight", (1, hidden))
        ]
    first, width = (0, inter) if tp is None else tp.split(inter)
    rows = {} if tp is None else {"src_len": width}
    cols = {} if tp is None else {"src_dim": 1, "src_start": first, "src_len": width}
    gate_up, down = f"{dst}.gate_up_proj", f"{dst}.down_proj"
    if f"{src}.experts.gate_up_proj" in names:
        fused_gate_up, fused_down = (num_experts, 2 * inter, hidden), (num_experts, hidden, inter)
        # one slot per expert, or — on a tensor-parallel rank — its gate rows and its up rows
        pieces = ((0, 0),) if tp is None else ((0, first), (width, inter + first))
        out[f"{src}.experts.gate_up_proj"] = [
            WeightSlot(gate_up, fused_gate_up, dst_row, local, e, src_start=src_row, **rows)
            for local, e in enumerate(owned)
            for dst_row, src_row in pieces
        ]
        out[f"{src}.experts.down_proj"] = [
            WeightSlot(down, fused_down, expert=local, src_expert=e, **cols)
            for local, e in enumerate(owned)
        ]
        return out
    gate_name, up_name, down_name = cfg.spec.moe.expert_weight_names
    local_of = {e: local for local, e in enumerate(owned)}
    for e in range(num_experts):
        names_e = [f"{src}.experts.{e}.{n}.weight" for n in (gate_name, up_name, down_name)]
        local = local_of.get(e)
        if local is None:
            skipped.update(names_e)
            continue
        out[names_e[0]] = [WeightSlot(gate_up, (inter, hidden), 0, local, src_start=first, **rows)]
        out[names_e[1]] = [
            WeightSlot(gate_up, (inter, hidden), width, local, src_start=first, **rows)
        ]
        out[names_e[2]] = [WeightSlot(down, (hidden, inter), 0, local, **cols)]
    return out
