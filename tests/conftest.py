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
    """Tests without a Ray cluster run first, then the Ray tests that start their own (``pdserve
    up`` from the CLI), then those on the session's simulated cluster: it starts with the first
    test that asks for it and lives to the end, and idle it still keeps about 0.3-0.4 of a core
    busy (ingress, KV index shards, Serve's controller, the stats board), which the tests before
    it are spared. The chaos suite's short form: ``chaos_full`` scenarios (replica kills, stalls,
    scaling, the 32K-token prompt) run only under ``PDSERVE_CHAOS=full`` (``make chaos``);
    otherwise they are deselected."""
    items.sort(key=_run_order)  # stable: files and their tests keep their order within a group
    if os.environ.get("PDSERVE_CHAOS") == "full":
        return
    dropped = [item for item in items if item.get_closest_marker("chaos_full")]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not item.get_closest_marker("chaos_full")]


def _run_order(item: pytest.Item) -> tuple[bool, bool]:
    """(starts Ray, runs on the session's simulated cluster): False sorts first."""
    on_sim_cluster = "sim_cluster" in getattr(item, "fixturenames", ())  # fixtures' closure
    return bool(item.get_closest_marker("ray")), on_sim_cluster


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
