"""Session fixtures of the integration and chaos suites: a simulated multi-node Ray cluster
and one shared pdserve app on it (``tests/cluster_fixtures.py``). Ray and the launcher are
imported only when a test asks for one of these fixtures: unit tests never load them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.cluster_fixtures import ServingApp, SimCluster


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests without a Ray cluster run first: the session's simulated cluster (its replicas,
    controller and index shards keep a share of both cores busy while it lives) starts with
    the first test that asks for it and is torn down at the end. The chaos suite's short form:
    ``chaos_full`` scenarios (replica kills, stalls, scaling) run only under
    ``PDSERVE_CHAOS=full`` (``make chaos``); otherwise they are deselected."""
    items.sort(key=lambda item: bool(item.get_closest_marker("ray")))  # stable: files keep order
    if os.environ.get("PDSERVE_CHAOS") == "full":
        return
    dropped = [item for item in items if item.get_closest_marker("chaos_full")]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not item.get_closest_marker("chaos_full")]


@pytest.fixture(scope="session")
def sim_cluster() -> Iterator[SimCluster]:
    """Head + prefill node + decode node, with the dashboard; torn down at the end."""
    from tests.cluster_fixtures import running_sim_cluster

    with running_sim_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def serving_app(sim_cluster: SimCluster, tmp_path_factory: pytest.TempPathFactory) -> ServingApp:
    """The shared app, deployed once per session."""
    from tests.cluster_fixtures import deploy_serving_app

    return deploy_serving_app(sim_cluster, tmp_path_factory.mktemp("kv-disk"))


@pytest.fixture
def app(serving_app: ServingApp) -> Iterator[ServingApp]:
    """The shared app; afterwards back to 1 prefill + 1 decode, undrained, no KV in use."""
    from tests.cluster_fixtures import reset_to_baseline

    yield serving_app
    reset_to_baseline(serving_app)
