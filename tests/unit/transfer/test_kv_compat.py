"""KV compatibility in the transfer handshake: an exporter's handle carries its ``KVCompat``; a
pull between replicas of equal compatibility moves the blocks, and one across compatibilities
(another model revision, hash seed, ...) is refused before any byte moves — by the importer,
naming what differs, and by the exporter for a request that names another fingerprint — over
gRPC and in process alike."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

from core.codec import from_plain, to_plain
from core.config import TransferConfig
from core.kv_compat import KVCompat
from core.kv_handle import KVHandle, TransferFailure, TransferState
from transfer import (
    InProcKVHub,
    InProcKVTransport,
    KVExportServer,
    KVImportClient,
    NumpyBlockStore,
)

pytestmark = pytest.mark.timeout(30)

OLD = KVCompat(model_revision="rev-old", layout="layout", hash_seed=0)
NEW = dataclasses.replace(OLD, model_revision="rev-new")


def test_the_handle_carries_the_exporters_compatibility_through_the_codec(
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
) -> None:
    server = make_server(make_store(8, seed=1), config, kv_compat=OLD)
    handle = server.export([1, 2])
    assert handle.kv_compat == OLD
    assert from_plain(KVHandle, to_plain(handle)) == handle


@pytest.mark.parametrize(
    ("exporter", "importer", "names"),
    [
        (OLD, OLD, None),
        (OLD, NEW, "model_revision: 'rev-old' != 'rev-new'"),
        (OLD, None, "declared by the exporter only"),
        (None, NEW, "declared by the importer only"),
    ],
)
def test_grpc_pulls_only_between_equal_compatibilities(
    config: TransferConfig,
    make_store: Callable[..., NumpyBlockStore],
    make_server: Callable[..., KVExportServer],
    make_client: Callable[..., KVImportClient],
    exporter: KVCompat | None,
    importer: KVCompat | None,
    names: str | None,
) -> None:
    server = make_server(make_store(8, seed=2), config, kv_compat=exporter)
    client = make_client(make_store(8), config, kv_compat=importer)
    handle = server.export([2, 3, 4])
    status = client.pull(handle, [5, 6, 7]).wait(timeout_s=10)
    if names is None:
        assert status.state is TransferState.DONE
        return
    assert status.state is TransferState.FAILED
    assert status.reason is TransferFailure.KV_INCOMPATIBLE
    assert names in status.message
    assert status.bytes_done == 0  # refused before any byte moved


def test_the_exporter_refuses_a_request_naming_another_compatibility(
    make_store: Callable[..., NumpyBlockStore],
) -> None:
    """An importer that lies about the handle still meets the exporter's own check."""
    hub = InProcKVHub()
    prefill = InProcKVTransport(make_store(8, seed=3), hub, kv_compat=OLD)
    decode = InProcKVTransport(make_store(8), hub, kv_compat=NEW)
    try:
        handle = prefill.export([1, 2])
        forged = dataclasses.replace(handle, kv_compat=NEW)  # passes the importer's check
        status = decode.pull(forged, [3, 4]).wait(timeout_s=10)
        assert status.state is TransferState.FAILED
        assert status.reason is TransferFailure.KV_INCOMPATIBLE
        assert "refusing the pull" in status.message
        assert status.bytes_done == 0
        handle = prefill.export([1, 2])  # (the refused importer released the first export)
        same = InProcKVTransport(make_store(8), hub, kv_compat=OLD)
        try:
            assert same.pull(handle, [5, 6]).wait(timeout_s=10).state is TransferState.DONE
            source, dest = prefill.exporter.store, same.exporter.store
            assert isinstance(source, NumpyBlockStore) and isinstance(dest, NumpyBlockStore)
            np.testing.assert_array_equal(dest.data[5:7], source.data[1:3])
        finally:
            same.close()
    finally:
        decode.close()
        prefill.close()
