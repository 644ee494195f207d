"""``cluster:``: the Ray cluster the app runs on (a local Ray the CLI starts, or one to join)."""

from __future__ import annotations

from pydantic import Field, model_validator

from core.config.base import MIB, StrictModel


class RayClusterConfig(StrictModel):
    """Where the app runs: a local Ray started by the CLI or an existing cluster."""

    address: str = Field(
        "local",
        description="local: the CLI starts a Ray on this machine; auto: join the cluster this "
        "machine belongs to; ray://host:port: a remote cluster (deploys go to its dashboard).",
    )
    namespace: str = Field("pdserve", min_length=1, description="Ray namespace of the CLI.")
    app_name: str = Field("pdserve", min_length=1, description="Serve application name.")
    route_prefix: str = Field(
        "/",
        pattern=r"^/([A-Za-z0-9._~-]+(/[A-Za-z0-9._~-]+)*)?$",
        description="HTTP path prefix of this app on Serve's proxy (several apps can share a "
        "cluster and a port under different prefixes); the OpenAI routes live below it.",
    )
    dashboard_url: str | None = Field(
        None,
        description="Ray dashboard URL that deploys and scales go through; None: "
        "http://127.0.0.1:<dashboard_port> (local, auto) or http://HOST:8265 (ray://HOST:PORT).",
    )
    dashboard_port: int = Field(
        8265, ge=1, le=65535, description="Dashboard port of a local Ray (and of auto's head)."
    )
    num_cpus: int | None = Field(
        8, ge=1, description="Logical CPUs of a local Ray (more than the cores is fine)."
    )
    object_store_memory_bytes: int | None = Field(
        256 * MIB, ge=80 * MIB, description="Object store of a local Ray; None: Ray's default."
    )
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom resources a local Ray's node advertises."
    )
    labels: dict[str, str] = Field(
        default_factory=dict, description="Node labels a local Ray's node carries."
    )

    @model_validator(mode="after")
    def _address_form(self) -> RayClusterConfig:
        if self.address not in ("local", "auto") and not self.address.startswith("ray://"):
            raise ValueError(
                f"address {self.address!r} must be 'local', 'auto' or 'ray://host:port'"
            )
        if self.dashboard_url and not self.dashboard_url.startswith(("http://", "https://")):
            raise ValueError(f"dashboard_url {self.dashboard_url!r} must start with http(s)://")
        return self

    @property
    def is_local(self) -> bool:
        """True when the CLI starts (and stops) its own Ray."""
        return self.address == "local"

    def resolved_dashboard_url(self) -> str:
        """The dashboard URL deploys go to (see ``dashboard_url``)."""
        if self.dashboard_url:
            return self.dashboard_url.rstrip("/")
        if self.address.startswith("ray://"):
            host = self.address.removeprefix("ray://").rsplit(":", 1)[0]
            return f"http://{host}:8265"
        return f"http://127.0.0.1:{self.dashboard_port}"
