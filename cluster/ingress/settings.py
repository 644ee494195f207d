"""The ingress's parameters: the config sections it reads plus what is derived from the config.

Built by the Serve application from the one ``ClusterConfig`` (``cluster.serve.ingress_setup``):
the ``server``, ``routing`` and ``disaggregation`` sections are the validated config models
themselves, so no range
or default is repeated here. Plain values only, no runtime state: draining and the in-flight
count live on :class:`cluster.ingress.http.request_gate.RequestGate`, which the app owns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.config import DisaggregationConfig, RoutingConfig, ServerConfig
from core.config.lora import LoRAModuleConfig


@dataclass(frozen=True)
class IngressSettings:
    """What the OpenAI ingress needs to know about the model and its limits."""

    served_model_names: tuple[str, ...]
    """Names clients may send as ``model``; the first is the canonical one."""
    max_model_len: int
    """Longest prompt + output in tokens (the smaller of the two pools' limits)."""
    block_size: int
    """Tokens per KV block, for the prompt's block hashes (the engines' value)."""
    hash_seed: int
    """The engines' block-hash seed (``engine.hash_seed``), so hashes predict real hits."""
    server: ServerConfig = field(default_factory=ServerConfig)
    """The HTTP endpoint's limits and timeouts."""
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    """The routing policy and the migration limit."""
    disaggregation: DisaggregationConfig = field(default_factory=DisaggregationConfig)
    """Disaggregation threshold and fallback."""
    pipelined_from_tokens: int | None = None
    """Prompts of at least this many tokens take the pipelined handoff (the decode starts with
    the prefill, pulling as the chunks complete); None: none do (``disaggregation.
    pipelined_handoff``)."""
    prefill_required: bool = True
    """True when the prefill pool always keeps a replica: ``/ready`` then waits for one. False
    without a prefill pool (colocated) or when it may scale to zero: every prompt then prefills
    on decode, so ``/ready`` needs decode only."""
    api_keys: frozenset[str] = field(default_factory=frozenset)
    """Accepted ``Authorization: Bearer`` keys (read in the replica); empty: no authentication."""
    stats_timeout_s: float = 5.0
    """Bound on the ``stats_provider`` call made by ``/metrics``."""
    owned_by: str = "pdserve"
    """``owned_by`` of the models in ``/v1/models``."""
    lora_modules: tuple[LoRAModuleConfig, ...] = ()
    """The model's LoRA adapters from the YAML (``model.lora_modules``)."""

    @property
    def model_name(self) -> str:
        """The canonical served model name."""
        return self.served_model_names[0]
