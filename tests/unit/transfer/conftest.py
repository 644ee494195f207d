"""Fixtures for the KV transfer tests: stores, loopback servers and clients, throwaway certs.

Every server and client a test starts is stopped at teardown, and each test ends by checking
that no transfer-layer thread (``pdserve-kv-*``) outlived it.
"""

from __future__ import annotations

import datetime
import ipaddress
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from core.config import TransferConfig
from core.kv_layout import KVLayout
from tests.unit.transfer.block_layout import LAYOUT
from tests.waiting import wait_until
from transfer import KVExportServer, KVImportClient, NumpyBlockStore
from transfer.faults import FaultInjection

TOKEN = "unit-test-token"


@pytest.fixture
def waiter() -> Callable[..., bool]:
    """The ``wait_until(predicate, timeout_s)`` helper."""
    return wait_until


@pytest.fixture
def config() -> TransferConfig:
    """Loopback config with a test token and short deadlines."""
    return TransferConfig(
        bind_host="127.0.0.1",
        chunk_bytes=1024 * 1024,
        insecure_test_token=TOKEN,
        pull_deadline_s=10.0,
        rpc_deadline_s=2.0,
    )


@pytest.fixture
def make_store() -> Callable[..., NumpyBlockStore]:
    """``make_store(num_blocks, layout=LAYOUT, seed=None)``: random-filled when seeded."""

    def make(
        num_blocks: int, layout: KVLayout = LAYOUT, seed: int | None = None
    ) -> NumpyBlockStore:
        store = NumpyBlockStore(layout, num_blocks)
        if seed is not None:
            store.fill_random(seed)
        return store

    return make


@pytest.fixture
def make_server() -> Iterator[Callable[..., KVExportServer]]:
    """``make_server(store, config, faults=None, **kwargs)``; every server is stopped at
    teardown."""
    servers: list[KVExportServer] = []

    def make(
        store: NumpyBlockStore,
        config: TransferConfig,
        faults: FaultInjection | None = None,
        **kwargs: Any,
    ) -> KVExportServer:
        server = KVExportServer(store, config, faults=faults, **kwargs)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def make_client() -> Iterator[Callable[..., KVImportClient]]:
    """``make_client(store, config, **kwargs)``; every client is closed at teardown."""
    clients: list[KVImportClient] = []

    def make(store: NumpyBlockStore, config: TransferConfig, **kwargs: Any) -> KVImportClient:
        client = KVImportClient(store, config, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail a test that leaves transfer-layer threads running after its teardown (threads that
    were already running before it — e.g. session fixtures of other suites — do not count)."""
    before = {t.ident for t in threading.enumerate()}
    yield

    def leaked() -> list[str]:
        return [
            t.name
            for t in threading.enumerate()
            if t.name.startswith("pdserve-kv") and t.ident not in before
        ]

    assert wait_until(lambda: not leaked(), timeout_s=5.0), leaked()


@dataclass(frozen=True)
class Pki:
    """Throwaway PEM files: a CA, a server and a client cert it signed, and a rogue client."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path
    rogue_key: Path


def _key_and_name(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Name]:
    key = ec.generate_private_key(ec.SECP256R1())
    return key, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _cert(
    name: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    is_ca: bool,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
    )
    if not is_ca:
        san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA with server and client certificates, plus a client cert from another CA."""
    directory = tmp_path_factory.mktemp("pki")
    ca_key, ca_name = _key_and_name("pdserve test CA")
    ca_cert = _cert(ca_name, ca_key, ca_name, ca_key, is_ca=True)
    ca_path, _ = _write(directory, "ca", ca_cert, ca_key)
    paths = {}
    for stem in ("server", "client"):
        key, name = _key_and_name(f"pdserve {stem}")
        paths[stem] = _write(directory, stem, _cert(name, key, ca_name, ca_key, is_ca=False), key)
    rogue_ca_key, rogue_ca_name = _key_and_name("rogue CA")
    rogue_key, rogue_name = _key_and_name("rogue client")
    rogue = _write(
        directory,
        "rogue",
        _cert(rogue_name, rogue_key, rogue_ca_name, rogue_ca_key, is_ca=False),
        rogue_key,
    )
    return Pki(ca_path, *paths["server"], *paths["client"], *rogue)
