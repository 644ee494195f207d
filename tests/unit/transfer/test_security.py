"""Auth token, mutual TLS, bind addresses and the transfer config's own checks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from pydantic import ValidationError

from core.config import TransferConfig
from core.errors import ConfigError, TransferError
from core.kv_handle import TransferFailure, TransferState
from replica.kv_token import KVToken
from transfer import KVExportServer, KVImportClient, NumpyBlockStore, ReleaseCause
from transfer.addressing import host_port, is_loopback, is_wildcard, node_address
from transfer.proto._generated import kv_transfer_pb2 as pb
from transfer.rpc import KVTransferClientMethods
from transfer.security import resolve_auth_token
from transfer.transfer_metrics import TransferSide

pytestmark = pytest.mark.timeout(30)

MakeStore = Callable[..., NumpyBlockStore]
MakeServer = Callable[..., KVExportServer]
MakeClient = Callable[..., KVImportClient]


@pytest.mark.parametrize("client_token", ["wrong-token", None])
def test_wrong_or_missing_token_is_rejected_and_changes_nothing(
    client_token: str | None,
    config: TransferConfig,
    make_store: MakeStore,
    make_server: MakeServer,
    make_client: MakeClient,
) -> None:
    server = make_server(make_store(4, seed=1), config)
    dest = make_store(4)
    client_config = config.model_copy(
        update={"insecure_test_token": client_token, "auth_token_env": None}
    )
    client = make_client(dest, client_config)
    released: list[ReleaseCause] = []
    handle = server.export(range(4), released.append)
    status = client.pull(handle, range(4)).wait(10)
    assert status.state is TransferState.FAILED
    assert status.reason == TransferFailure.UNAUTHENTICATED
    with pytest.raises(TransferError) as info:
        client.heartbeat(handle)
    assert info.value.reason == TransferFailure.UNAUTHENTICATED
    with pytest.raises(TransferError):
        client.release(handle)
    assert released == [] and server.exporter.num_live_exports() == 1
    assert not dest.data.any()
    with grpc.insecure_channel(server.address) as channel:
        with pytest.raises(grpc.RpcError) as raw:
            KVTransferClientMethods(channel).release(
                pb.ReleaseRequest(transfer_id=handle.transfer_id), timeout=5
            )
        assert raw.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    assert released == []
    # Pull, Heartbeat, Release and the raw Release: four refusals, each counted once.
    export_stats = server.metrics.snapshot().role_stats(TransferSide.EXPORT)
    assert export_stats.unauthenticated_calls_total == 4


def tls_config(config: TransferConfig, cert: Path, key: Path, ca: Path) -> TransferConfig:
    return config.model_copy(
        update={"tls_cert_file": str(cert), "tls_key_file": str(key), "tls_ca_file": str(ca)}
    )


def test_mtls_accepts_a_client_signed_by_the_ca(
    pki: Any,
    config: TransferConfig,
    make_store: MakeStore,
    make_server: MakeServer,
    make_client: MakeClient,
) -> None:
    source, dest = make_store(4, seed=2), make_store(4)
    server = make_server(source, tls_config(config, pki.server_cert, pki.server_key, pki.ca))
    assert server.tls
    client = make_client(dest, tls_config(config, pki.client_cert, pki.client_key, pki.ca))
    client.pull(server.export(range(4)), range(4)).result(timeout_s=10)
    np.testing.assert_array_equal(dest.data, source.data)


@pytest.mark.parametrize("client", ["rogue-cert", "plaintext"])
def test_mtls_rejects_foreign_or_missing_client_certificates(
    client: str,
    pki: Any,
    config: TransferConfig,
    make_store: MakeStore,
    make_server: MakeServer,
    make_client: MakeClient,
) -> None:
    server = make_server(
        make_store(4, seed=3), tls_config(config, pki.server_cert, pki.server_key, pki.ca)
    )
    if client == "rogue-cert":
        client_config = tls_config(config, pki.rogue_cert, pki.rogue_key, pki.ca)
    else:
        client_config = config
    dest = make_store(4)
    released: list[ReleaseCause] = []
    handle = server.export(range(4), released.append)
    status = make_client(dest, client_config).pull(handle, range(4)).wait(10)
    assert status.state is TransferState.FAILED
    assert status.reason == TransferFailure.EXPORTER_UNAVAILABLE
    assert released == [] and server.exporter.num_live_exports() == 1
    assert not dest.data.any()


def test_token_sources_and_precedence(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    env = {"KV_TOKEN": "from-env"}
    assert resolve_auth_token(TransferConfig(auth_token_env="KV_TOKEN"), env) == b"from-env"
    from_file = TransferConfig(auth_token_env="KV_TOKEN", auth_token_file=str(token_file))
    assert resolve_auth_token(from_file, env) == b"from-file"
    inline = TransferConfig(auth_token_env="KV_TOKEN", insecure_test_token="inline")
    assert resolve_auth_token(inline, env) == b"inline"
    assert resolve_auth_token(TransferConfig(auth_token_env="KV_TOKEN"), {}) is None
    with pytest.raises(ConfigError, match="require_auth"):
        resolve_auth_token(TransferConfig(auth_token_env="KV_TOKEN", require_auth=True), {})
    missing = TransferConfig(auth_token_file=str(tmp_path / "missing"))
    with pytest.raises(ConfigError) as info:
        resolve_auth_token(missing, {})
    assert info.value.param == "transfer.auth_token_file"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"chunk_bytes": 512 * 1024}, "greater than or equal"),
        ({"chunk_bytes": 8 * 1024 * 1024}, "less than or equal"),
        ({"max_message_bytes": 2 * 1024 * 1024}, "max_message_bytes"),
        ({"max_message_bytes": 64 * 1024 * 1024}, "less than or equal"),
        ({"tls_cert_file": "a.crt"}, "mTLS"),
        ({"auth_token_file": "t", "insecure_test_token": "x"}, "at most one"),
        ({"lease_s": 0}, "greater than"),
        ({"chunk": 1}, "Extra inputs"),
    ],
)
def test_config_rejects_inconsistent_values(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TransferConfig(**fields)


def test_default_bind_is_the_node_address_and_wildcards_only_when_asked(
    make_store: MakeStore, make_client: MakeClient
) -> None:
    assert not is_wildcard(node_address())
    config = TransferConfig(insecure_test_token="t")
    assert config.bind_host is None
    server = KVExportServer(make_store(2, seed=4), config, node_host="127.0.0.1")
    try:
        assert server.address.startswith("127.0.0.1:")
    finally:
        server.stop()
    wildcard = TransferConfig(bind_host="0.0.0.0", insecure_test_token="t")
    server = KVExportServer(make_store(2, seed=4), wildcard, node_host="127.0.0.1")
    try:
        assert server.address.startswith("127.0.0.1:")  # advertised: the node, not 0.0.0.0
        make_client(make_store(2), wildcard).pull(server.export([0]), [1]).result(timeout_s=10)
    finally:
        server.stop()


def test_host_port_brackets_ipv6() -> None:
    assert host_port("::1", 5) == "[::1]:5"
    assert host_port("10.0.0.1", 5) == "10.0.0.1:5"
    assert host_port("node-a", 5) == "node-a:5"


def test_an_unbindable_address_is_a_config_error(make_store: MakeStore) -> None:
    unbindable = TransferConfig(bind_host="192.0.2.1", insecure_test_token="t")  # TEST-NET-1
    with pytest.raises(ConfigError) as info:
        KVExportServer(make_store(1), unbindable)
    assert info.value.param == "transfer.port"


@pytest.mark.parametrize("host", ["10.1.2.3", "0.0.0.0", "node-a"])
def test_no_token_on_a_routable_address_is_refused(make_store: MakeStore, host: str) -> None:
    open_config = TransferConfig(bind_host=host, auth_token_env=None)
    with pytest.raises(ConfigError, match="not a loopback address") as info:
        KVExportServer(make_store(1), open_config)
    assert info.value.param == "transfer.auth_token_env"


def test_no_token_on_loopback_is_allowed(make_store: MakeStore) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    server = KVExportServer(
        make_store(1), TransferConfig(bind_host="127.0.0.1", auth_token_env=None)
    )
    server.stop()


def test_a_generated_cluster_secret_reaches_the_replica_and_stays_out_of_reprs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PDSERVE_KV_TOKEN", raising=False)
    config = TransferConfig()
    token = KVToken.for_deploy(config)
    assert token is not None and len(token.value) >= 40
    assert token.value not in repr(token) and token.value not in str(token)
    installed = token.install(config)
    assert resolve_auth_token(installed) == token.value.encode()
    assert token.value not in repr(installed) and token.value not in installed.model_dump_json()
    # Once a token resolves in the deploying process, nothing is generated; configured wins.
    assert KVToken.for_deploy(config) is None
    assert KVToken.generate().install(installed) is installed
    assert resolve_auth_token(installed) == token.value.encode()
