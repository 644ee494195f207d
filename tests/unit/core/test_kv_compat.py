"""The KV compatibility fingerprint: stable, sensitive to every field, and able to name what
differs; its transfer protocol is the protobuf package the transfer layer speaks."""

from __future__ import annotations

import dataclasses

import pytest

from core.kv_compat import TRANSFER_PROTOCOL, KVCompat

BASE = KVCompat(model_revision="r1", layout="l1", hash_seed=0, speculative="")


def test_the_fingerprint_is_stable_and_short() -> None:
    assert BASE.fingerprint() == KVCompat("r1", "l1").fingerprint()
    assert len(BASE.fingerprint()) == 16


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("model_revision", "r2"),
        ("layout", "l2"),
        ("hash_seed", 7),
        ("speculative", "ngram:4"),
        ("transfer_protocol", "pdserve.kv.v2"),
        ("kv_format", 2),
    ],
)
def test_every_field_changes_the_fingerprint_and_is_named(field: str, value: object) -> None:
    other = dataclasses.replace(BASE, **{field: value})
    assert other.fingerprint() != BASE.fingerprint()
    (difference,) = BASE.differences(other)
    assert difference.startswith(f"{field}: ")
    assert BASE.differences(BASE) == []


def test_the_protocol_is_the_transfer_layers_protobuf_package() -> None:
    from transfer.proto._generated import kv_transfer_pb2

    assert kv_transfer_pb2.DESCRIPTOR.package == TRANSFER_PROTOCOL
