"""Process-local routing state the cluster unit tests share a worker process with: a replica a
router saw leave (``cluster.routing.departed``) must not hide another test's replica of the
same id."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cluster.routing import departed


@pytest.fixture(autouse=True)
def _no_departed_replicas() -> Iterator[None]:
    departed.prune(())
    yield
    departed.prune(())
