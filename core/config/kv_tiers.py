"""The KV memory hierarchy below the device pool: a host-RAM tier, a disk tier, idle TTLs.

Blocks leaving the device pool's prefix cache are copied down instead of dropped (host first,
then disk); a prefix lookup walks device -> host -> disk and brings hits back asynchronously.
Every tier is off unless configured. A tier's ``min_reuse`` is its admission gate: a block
enters it only once it has been used (computed or hit) that many times, so one-off prompts do
not push reusable prefixes out of a small tier.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from core.config.base import StrictModel

WritePolicy = Literal["write_through", "on_evict"]


class HostTierConfig(StrictModel):
    """KV blocks in host RAM (pinned on CUDA)."""

    bytes: int = Field(ge=1, description="Host memory for KV blocks, in bytes.")
    write_policy: WritePolicy = Field(
        "on_evict",
        description="on_evict: copy a block down when the device pool evicts it; "
        "write_through: copy every block as soon as it is cached on the device (eviction is "
        "then free, at the price of copying blocks that may never be evicted).",
    )
    min_reuse: int = Field(1, ge=1, description="Uses a block needs before it is stored here.")


class DiskTierConfig(StrictModel):
    """KV blocks as checksummed files under ``path`` (one sub-directory per engine)."""

    path: str = Field(min_length=1, description="Directory of the disk tier (created if absent).")
    bytes: int = Field(ge=1, description="Disk space for KV blocks, in bytes.")
    min_reuse: int = Field(1, ge=1, description="Uses a block needs before it is written here.")


class KVTiersConfig(StrictModel):
    """``engine.kv_tiers``: the tiers and their session timeouts (idle TTLs)."""

    host: HostTierConfig | None = Field(
        None, description="The host-RAM tier (the first one below the device); None: off."
    )
    disk: DiskTierConfig | None = Field(
        None, description="The disk tier (below host, or below the device alone); None: off."
    )
    device_ttl_s: float | None = Field(
        None,
        gt=0,
        description="A cached, unreferenced device block idle this long is demoted to the "
        "next tier (or released when there is none). None: kept until evicted for space.",
    )
    host_ttl_s: float | None = Field(
        None, gt=0, description="Idle time after which a host block moves to disk or is dropped."
    )
    disk_ttl_s: float | None = Field(
        None, gt=0, description="Idle time after which a disk block is deleted."
    )
    max_keep_alive_s: float = Field(
        3600.0,
        ge=0,
        description="Bound on a request's kv_keep_alive_s: how long past its end a session may "
        "ask its cached device blocks to be spared by device_ttl_s (0: no keep-alive).",
    )

    @model_validator(mode="after")
    def _ttl_needs_tier(self) -> KVTiersConfig:
        if self.host_ttl_s is not None and self.host is None:
            raise ValueError("kv_tiers.host_ttl_s is set but there is no kv_tiers.host tier")
        if self.disk_ttl_s is not None and self.disk is None:
            raise ValueError("kv_tiers.disk_ttl_s is set but there is no kv_tiers.disk tier")
        return self

    @property
    def enabled(self) -> bool:
        """True when any lower tier or TTL is configured."""
        return self.host is not None or self.disk is not None or self.device_ttl_s is not None
