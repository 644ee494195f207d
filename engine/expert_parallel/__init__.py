"""Expert parallelism at the layer level: the placement plan, the EP MoE layer and its dispatch,
the collectives it runs on (a torch process group, or threads in tests), load statistics and
the rebalancing plan. Everything here sits below :class:`~engine.engine.LLMEngine`; what steps
an engine in lockstep with its peers is in :mod:`engine.gangs`."""

from engine.expert_parallel.agreement import check_placement_agreement
from engine.expert_parallel.balancer import ExpertLoadBalancer
from engine.expert_parallel.collective import EPCollective, TorchProcessGroupCollective
from engine.expert_parallel.install import ExpertParallelModel, install_expert_parallel
from engine.expert_parallel.load_stats import ExpertLoadStats
from engine.expert_parallel.moe_layer import ExpertParallelMoE
from engine.expert_parallel.placement import ExpertPlacement
from engine.expert_parallel.process_group import join_process_group, rendezvous_address
from engine.expert_parallel.rebalance_plan import max_mean_load_ratio, rebalance_placement
from engine.expert_parallel.reshard import apply_placement
from engine.expert_parallel.thread_collective import InProcCollective, InProcGroup
from engine.expert_parallel.timing import StepTimer

__all__ = [
    "EPCollective",
    "ExpertLoadBalancer",
    "ExpertLoadStats",
    "ExpertParallelMoE",
    "ExpertParallelModel",
    "ExpertPlacement",
    "InProcCollective",
    "InProcGroup",
    "StepTimer",
    "TorchProcessGroupCollective",
    "apply_placement",
    "check_placement_agreement",
    "install_expert_parallel",
    "join_process_group",
    "max_mean_load_ratio",
    "rebalance_placement",
    "rendezvous_address",
]
