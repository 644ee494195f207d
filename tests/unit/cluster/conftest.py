"""Process-local routing state the cluster unit tests share a worker process with: the replica
sets a test's routers held (``cluster.routing.routed_replicas``) must not hide another test's
replicas of the same deployment."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cluster.routing import routed_replicas


@pytest.fixture(autouse=True)
def _no_routed_replicas() -> Iterator[None]:
    routed_replicas.forget()
    yield
    routed_replicas.forget()
