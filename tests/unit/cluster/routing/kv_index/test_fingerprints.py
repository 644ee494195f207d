"""The per-fingerprint view of the candidates: only replicas of the request's fingerprint, all
of them for a request of none or of a fingerprint no replica reports."""

from __future__ import annotations

import pytest

from cluster.routing.kv_index import of_fingerprint

pytestmark = pytest.mark.timeout(10)

FLEET = {"p0": "old", "p1": "new", "p2": "new", "p3": ""}


@pytest.mark.parametrize(
    ("fingerprint", "expected"),
    [("new", ["p1", "p2"]), ("old", ["p0"]), ("", list(FLEET)), ("gone", list(FLEET))],
)
def test_of_fingerprint(fingerprint: str, expected: list[str]) -> None:
    assert of_fingerprint(list(FLEET), fingerprint, FLEET.__getitem__) == expected
