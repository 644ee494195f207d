"""Turn a built :class:`CausalLM` into one rank of an expert-parallel gang, by composition.

:func:`install_expert_parallel` swaps every decoder layer's :class:`MoELayer` for an
:class:`ExpertParallelMoE` wrapping it (``add_module`` replaces the ``mlp`` child in place) and
hooks the model's forward to count steps for the load statistics, the step timer and the
lockstep stepper. The model must have been loaded with exactly the experts the placement gives
this rank (``load_model(..., expert_ids=placement.experts_of(rank))``), so a rank never holds
another rank's weights. No engine file changes: the runner keeps calling ``model(...)``.
"""

from __future__ import annotations

import torch

from core.errors import ConfigError
from engine.expert_parallel.collective import EPCollective
from engine.expert_parallel.dispatch import ReplicaRouter
from engine.expert_parallel.load_stats import ExpertLoadStats
from engine.expert_parallel.moe_layer import ExpertParallelMoE
from engine.expert_parallel.placement import ExpertPlacement
from engine.expert_parallel.timing import StepTimer
from engine.models.decoder import CausalLM, DecoderLayer
from engine.models.moe import MoELayer


class ExpertParallelModel:
    """A model with expert-parallel MoE layers: its statistics, timer and empty step."""

    def __init__(
        self,
        model: CausalLM,
        layers: list[ExpertParallelMoE],
        stats: ExpertLoadStats,
        timer: StepTimer | None,
    ) -> None:
        self.model = model
        self.layers = layers
        self.stats = stats
        self.timer = timer
        self.num_forwards = 0  # forwards started (real or empty) on this rank
        model.register_forward_pre_hook(lambda _module, _args: self._begin_step())
        model.register_forward_hook(lambda _module, _args, _output: self._end_step())

    @torch.inference_mode()
    def empty_forward(self) -> None:
        """Take part in one step with no tokens: every MoE layer's collectives, in layer order,
        with zero rows (what a rank without work runs so its peers' forward can complete)."""
        param = self.model.embed_tokens.weight
        empty = param.new_empty((0, self.model.config.hidden_size))  # [0, H]
        self._begin_step()
        for layer in self.layers:
            layer(empty)
        self._end_step()

    def _begin_step(self) -> None:
        self.num_forwards += 1
        self.stats.begin_step()
        if self.timer is not None:
            self.timer.begin_step()

    def _end_step(self) -> None:
        self.stats.end_step()
        if self.timer is not None:
            self.timer.end_step()


def install_expert_parallel(
    model: CausalLM,
    collective: EPCollective,
    placement: ExpertPlacement,
    *,
    timer: StepTimer | None = None,
) -> ExpertParallelModel:
    """Make ``model``'s MoE layers dispatch over ``collective`` as ``placement`` says.

    Raises :class:`ConfigError` when the model has no MoE layer, when the placement's expert
    count or world size does not match, or when a layer holds other experts than the placement
    gives this rank.
    """
    rank = collective.rank
    if placement.num_ranks != collective.world_size:
        raise ConfigError(
            f"placement is for {placement.num_ranks} ranks, the gang has {collective.world_size}",
            param="expert_parallel",
        )
    if placement.num_experts != model.config.num_experts:
        raise ConfigError(
            f"placement covers {placement.num_experts} experts, the model has "
            f"{model.config.num_experts}",
            param="placement",
        )
    held = placement.experts_of(rank)
    if any(isinstance(getattr(layer, "mlp", None), ExpertParallelMoE) for layer in model.layers):
        raise ConfigError("expert parallelism is already installed", param="expert_parallel")
    moe_layers = _moe_layers(model)
    if not moe_layers:
        raise ConfigError("expert parallelism needs a MoE model", param="expert_parallel")
    device = model.embed_tokens.weight.device
    router = ReplicaRouter(placement, rank, device)
    stats = ExpertLoadStats(rank, len(moe_layers), placement.num_experts, held)
    wrapped = []
    for index, (layer, moe) in enumerate(moe_layers):
        if moe.expert_ids != held:
            raise ConfigError(
                f"rank {rank} holds experts {list(moe.expert_ids)}, the placement gives it "
                f"{list(held)}: load the model with expert_ids=placement.experts_of(rank)",
                param="expert_ids",
            )
        ep_layer = ExpertParallelMoE(
            moe, collective, router, moe_layer_index=index, stats=stats, timer=timer
        )
        layer.add_module("mlp", ep_layer)
        wrapped.append(ep_layer)
    return ExpertParallelModel(model, wrapped, stats, timer)


def _moe_layers(model: CausalLM) -> list[tuple[DecoderLayer, MoELayer]]:
    """The decoder layers whose MLP is a (not yet wrapped) :class:`MoELayer`, in order."""
    found = []
    for layer in model.layers:
        if isinstance(layer, DecoderLayer) and isinstance(layer.mlp, MoELayer):
            found.append((layer, layer.mlp))
    return found
