"""``server:``: the OpenAI-compatible HTTP endpoint (Serve's proxy and the Ingress deployment)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from core.config.base import MIB, StrictModel


class ServerConfig(StrictModel):
    """The OpenAI-compatible HTTP endpoint (Serve's proxy plus the Ingress deployment)."""

    host: str = Field("127.0.0.1", description="Address the HTTP proxy binds.")
    port: int = Field(8000, ge=1, le=65535, description="HTTP port.")
    api_keys_env: str | None = Field(
        None, description="Environment variable holding comma-separated API keys; None: open."
    )
    api_keys_file: str | None = Field(
        None, description="File of API keys, one per line; exclusive with api_keys_env."
    )
    context_overflow: Literal["error", "truncate_left"] = Field(
        "error",
        description="A prompt that leaves no room for the requested max_tokens within "
        "max_model_len: error (a 400 with the numbers) or truncate_left (drop its oldest tokens "
        "until it fits, leaving room for max_tokens, or 16 tokens when none is requested).",
    )
    cache_salt_per_api_key: bool = Field(
        False,
        description="Salt every request's prefix-cache hashes with (a digest of) its API key, so "
        "tenants with different keys never share cached KV on any replica or tier (needs API "
        "keys). A request's own cache_salt is combined with it.",
    )
    num_replicas: int = Field(1, ge=1, description="Ingress replicas.")
    num_cpus: float = Field(0.5, ge=0.0, description="Logical CPUs reserved per Ingress replica.")
    max_in_flight_requests: int = Field(
        256, ge=1, description="Requests one Ingress replica serves at once; more get 429."
    )
    retry_after_s: float = Field(
        1.0, ge=0.0, description="Retry-After sent with a 429 when the server is overloaded."
    )
    max_n: int = Field(
        16,
        ge=1,
        description="Largest n and best_of one request may ask for (each is that many "
        "sequences; unbounded, one request could occupy the cluster).",
    )
    max_batch_prompts: int = Field(
        64, ge=1, description="Most prompts one /v1/completions request may batch."
    )
    max_request_body_bytes: int = Field(
        8 * MIB, ge=1024, description="Largest accepted request body; more gets 413."
    )
    prefill_timeout_s: float = Field(
        120.0, gt=0.0, description="Bound on one remote prefill call (prompt compute included)."
    )
    chunk_timeout_s: float = Field(
        120.0, gt=0.0, description="Bound on the wait for each next chunk of a decode stream."
    )
    request_timeout_s: float | None = Field(
        None, gt=0.0, description="End-to-end HTTP request timeout at the proxy; None: none."
    )
    proxy_location: Literal["HeadOnly", "EveryNode"] = Field(
        "HeadOnly", description="Where Serve runs HTTP proxies: the head only or every node."
    )
    max_header_bytes: int = Field(
        32 * 1024,
        ge=1024,
        description="Largest accepted request header block (names + values); more gets 400.",
    )
    public_routes: tuple[str, ...] = Field(
        (),
        description="Routes served without an API key when keys are set (e.g. /metrics for a "
        "scraper). /health and /ready never need one; everything else does.",
    )
    fault_injection: bool = Field(
        False,
        description="Serve POST /admin/faults, which kills a pool's replica or makes KV "
        "transfers fail or stall for a while (load tests that inject faults). Off: no such "
        "route. Never on in production; API keys apply to it when set.",
    )

    @model_validator(mode="after")
    def _one_key_source(self) -> ServerConfig:
        if self.api_keys_env and self.api_keys_file:
            raise ValueError("set at most one of api_keys_env and api_keys_file")
        if self.cache_salt_per_api_key and not (self.api_keys_env or self.api_keys_file):
            raise ValueError(
                "server.cache_salt_per_api_key needs API keys (api_keys_env or api_keys_file)"
            )
        return self
