"""Process-local routing state the cluster unit tests share a worker process with: the replica
sets a test's routers held (``cluster.routing.routed_replicas``) must not hide another test's
replicas of the same deployment, nor the fingerprints a test's board published
(``cluster.routing.board_fingerprints``) name another test's replicas."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cluster.routing import board_fingerprints, routed_replicas


@pytest.fixture(autouse=True)
def _no_routed_replicas() -> Iterator[None]:
    routed_replicas.forget()
    board_fingerprints.publish({})
    yield
    routed_replicas.forget()
    board_fingerprints.publish({})
