"""The ingress's parameters: one frozen dataclass the deploy helper builds from ``core.config``.

Plain values only, no runtime state: draining and the in-flight count live on
:class:`cluster.ingress.admission.RequestGate`, which the app owns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.errors import ConfigError


@dataclass(frozen=True)
class IngressSettings:
    """What the OpenAI ingress needs to know about the model and its limits."""

    served_model_names: tuple[str, ...]
    """Names clients may send as ``model``; the first is the canonical one."""
    max_model_len: int
    """Longest prompt + output in tokens (the engine's effective limit)."""
    block_size: int = 16
    """Tokens per KV block, for the prompt's block hashes (must equal the engine's)."""
    hash_seed: int = 0
    """``KVLayout.hash_seed`` of the engine, so the hashes predict real prefix-cache hits."""
    local_prefill_threshold_tokens: int = 64
    """Prompts with fewer uncached tokens than this prefill locally on decode (0: never)."""
    fallback_to_local_prefill: bool = True
    """Prefill locally on decode when a remote prefill fails; else fail the request cleanly."""
    prefill_required: bool = True
    """True when the prefill pool always keeps a replica: ``/ready`` then waits for one. False
    without a prefill pool (colocated) or when it may scale to zero: every prompt then prefills
    on decode, so ``/ready`` needs decode only."""
    api_keys: frozenset[str] = field(default_factory=frozenset)
    """Accepted ``Authorization: Bearer`` keys; empty: no authentication."""
    max_in_flight_requests: int = 256
    """Requests served at once by this ingress; more get 429 with ``Retry-After``."""
    retry_after_s: float = 1.0
    """``Retry-After`` sent with a 429."""
    max_request_body_bytes: int = 8 * 1024 * 1024
    """Largest accepted request body; more gets 413."""
    prefill_timeout_s: float = 120.0
    """Bound on one remote prefill call (prompt compute included)."""
    chunk_timeout_s: float = 120.0
    """Bound on the wait for each next chunk of a decode stream (the first includes the KV pull)."""
    stats_timeout_s: float = 5.0
    """Bound on the ``stats_provider`` call made by ``/metrics``."""
    owned_by: str = "pdserve"
    """``owned_by`` of the models in ``/v1/models``."""

    def __post_init__(self) -> None:
        if not self.served_model_names:
            raise ConfigError("at least one served model name is needed", param="served_name")
        positive = {
            "max_model_len": self.max_model_len,
            "block_size": self.block_size,
            "max_in_flight_requests": self.max_in_flight_requests,
            "max_request_body_bytes": self.max_request_body_bytes,
            "prefill_timeout_s": self.prefill_timeout_s,
            "chunk_timeout_s": self.chunk_timeout_s,
            "stats_timeout_s": self.stats_timeout_s,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ConfigError(f"{name} must be positive, got {value!r}", param=name)
        if self.local_prefill_threshold_tokens < 0:
            raise ConfigError(
                "local_prefill_threshold_tokens must be >= 0",
                param="local_prefill_threshold_tokens",
            )
        if self.retry_after_s < 0:
            raise ConfigError("retry_after_s must be >= 0", param="retry_after_s")

    @property
    def model_name(self) -> str:
        """The canonical served model name."""
        return self.served_model_names[0]
