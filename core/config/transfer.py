"""The KV transfer section: the gRPC data plane between prefill and decode."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from core.config.base import MIB, StrictModel


class TransferConfig(StrictModel):
    """The gRPC KV data plane between prefill and decode (ARCHITECTURE §3), both sides."""

    bind_host: str | None = Field(
        None,
        description="Address the export server binds; None: the node's address. A wildcard "
        "(0.0.0.0 or ::) only when set here explicitly.",
    )
    port: int = Field(
        0, ge=0, le=65535, description="Export server port; 0 picks a free one per worker."
    )
    chunk_bytes: int = Field(
        2 * MIB, ge=MIB, le=4 * MIB, description="Payload bytes per streamed chunk (1-4 MiB)."
    )
    max_message_bytes: int = Field(
        8 * MIB,
        le=32 * MIB,
        description="gRPC max send/receive message size, set on both sides; must exceed "
        "chunk_bytes by >= 64 KiB of framing and stay <= 32 MiB.",
    )
    lease_s: float = Field(
        30.0, gt=0.0, description="Seconds an export stays pinned without a pull or heartbeat."
    )
    pull_deadline_s: float = Field(
        30.0,
        gt=0.0,
        description="Deadline of one whole Pull stream, and the longest a pipelined pull waits "
        "for its export to gain a block.",
    )
    rpc_deadline_s: float = Field(
        5.0, gt=0.0, description="Deadline of each Heartbeat and Release call."
    )
    server_threads: int = Field(
        8, ge=1, le=256, description="Export server threads (Pull streams served at once)."
    )
    import_threads: int = Field(
        4, ge=1, le=256, description="Importer threads (pulls run at once per decode worker)."
    )
    num_streams: int | None = Field(
        None,
        ge=1,
        le=64,
        description="Concurrent gRPC streams one large pull is spread over; None: half the "
        "decode host's cores, 1 to 8 (each stream's verify-and-copy and the gRPC threads under "
        "it take a core each).",
    )
    same_node: Literal["auto", "host", "off"] = Field(
        "auto",
        description="auto: a pull from an exporter on the same node skips the socket — on GPUs "
        "its blocks are copied device to device out of the exporter's KV (CUDA IPC), else out of "
        "its shared-memory host KV; host: only the shared-memory path; off: every pull goes over "
        "gRPC. gRPC stays the path across nodes and the fallback. A prefill keeps its KV's host "
        "bytes in /dev/shm unless off.",
    )
    min_stream_bytes: int = Field(
        4 * MIB,
        ge=64 * 1024,
        description="Fewest bytes one stream of a split pull carries (smaller pulls stay one "
        "stream); also the smallest segment a pipelined pull starts as the prefill computes.",
    )
    auth_token_env: str | None = Field(
        "PDSERVE_KV_TOKEN", description="Environment variable holding the shared auth token."
    )
    auth_token_file: str | None = Field(
        None, description="File holding the shared auth token; wins over auth_token_env."
    )
    insecure_test_token: str | None = Field(
        None, description="The auth token inline: tests only, never a real token in YAML."
    )
    require_auth: bool = Field(
        False, description="Refuse to start without a token (else: unauthenticated + warning)."
    )
    tls_cert_file: str | None = Field(None, description="PEM certificate of this worker (mTLS).")
    tls_key_file: str | None = Field(None, description="PEM private key of tls_cert_file.")
    tls_ca_file: str | None = Field(
        None, description="PEM CA bundle that signs every peer's certificate (mTLS)."
    )
    tls_server_name: str | None = Field(
        None, description="Name to verify in the exporter's certificate instead of its host."
    )

    @model_validator(mode="after")
    def _consistent(self) -> TransferConfig:
        if self.max_message_bytes < self.chunk_bytes + 64 * 1024:
            raise ValueError(
                f"max_message_bytes ({self.max_message_bytes}) must be >= chunk_bytes "
                f"({self.chunk_bytes}) + 64 KiB"
            )
        tls = (self.tls_cert_file, self.tls_key_file, self.tls_ca_file)
        if any(tls) and not all(tls):
            raise ValueError("mTLS needs tls_cert_file, tls_key_file and tls_ca_file together")
        if self.auth_token_file and self.insecure_test_token:
            raise ValueError("set at most one of auth_token_file and insecure_test_token")
        return self
