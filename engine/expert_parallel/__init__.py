"""Expert parallelism: placement plan, EP MoE layer over torch.distributed, lockstep stepping,
load balancing by redundant expert copies."""

from engine.parallel.agreement import check_placement_agreement
from engine.parallel.balancer import ExpertLoadBalancer
from engine.parallel.builder import build_ep_stepper
from engine.parallel.collective import EPCollective, TorchEPCollective
from engine.parallel.eplb import max_mean_load_ratio, rebalance_placement
from engine.parallel.group import init_ep_process_group, rendezvous_address
from engine.parallel.inproc import InProcCollective, InProcGroup
from engine.parallel.install import ExpertParallelModel, install_expert_parallel
from engine.parallel.moe_layer import ExpertParallelMoE
from engine.parallel.placement import ExpertPlacement
from engine.parallel.reshard import apply_placement
from engine.parallel.stats import ExpertLoadStats
from engine.parallel.stepper import EPStepper, LockstepOutput, SteppableEngine
from engine.parallel.timing import StepTimer

__all__ = [
    "EPCollective",
    "EPStepper",
    "ExpertLoadBalancer",
    "ExpertLoadStats",
    "ExpertParallelMoE",
    "ExpertParallelModel",
    "ExpertPlacement",
    "InProcCollective",
    "InProcGroup",
    "LockstepOutput",
    "StepTimer",
    "SteppableEngine",
    "TorchEPCollective",
    "apply_placement",
    "build_ep_stepper",
    "check_placement_agreement",
    "init_ep_process_group",
    "install_expert_parallel",
    "max_mean_load_ratio",
    "rebalance_placement",
    "rendezvous_address",
]
