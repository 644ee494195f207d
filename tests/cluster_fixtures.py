"""The Ray side of the integration and chaos suites: a simulated multi-node Ray cluster and one
shared pdserve app on it, as plain context managers the root ``conftest`` fixtures call (so a
unit test never imports Ray or the launcher).

The cluster is three Ray nodes on this machine: a head (Serve's controller, proxy, ingress), a
*prefill* node carrying the label ``pdserve.io/pool=prefill`` and a *decode* node carrying the
custom resource ``decode_node``. The shared app is deployed through Serve's REST API exactly
as ``pdserve up`` does; :func:`reset_to_baseline` puts it back in its baseline state (one
prefill and one decode replica, not draining, no KV in use) after every test.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import ray
from ray import serve
from ray.cluster_utils import Cluster
from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

from cluster.ops.deploy_schema import deploy_schema
from cluster.ops.launcher import deploy
from cluster.ops.rest import ServeRest
from cluster.routing.kv_index.actor import kill_index_actor
from cluster.serve.config_file import load_cluster_config
from cluster.serve.pool_options import BOARD_DEPLOYMENT, INGRESS_DEPLOYMENT
from core.config import ClusterConfig
from tests.integration.support import (
    APP_NAME,
    DECODE_RESOURCE,
    PREFILL_LABEL,
    app_config,
    app_tiers,
    descendant_pids,
    free_port,
    is_running,
)
from tests.waiting import wait_until

_MIB = 1024 * 1024

logger = logging.getLogger(__name__)


@dataclass
class SimCluster:
    """The running multi-node simulation."""

    cluster: Cluster
    dashboard_url: str
    head_node_id: str
    prefill_node_id: str
    decode_node_id: str


@dataclass
class ServingApp:
    """The shared app: its config, endpoint and the handles tests poke at."""

    config: ClusterConfig
    endpoint: str
    rest: ServeRest

    def board(self) -> dict[str, list[dict[str, Any]]]:
        """The stats board's reports by role."""
        handle = serve.get_deployment_handle(BOARD_DEPLOYMENT, APP_NAME)
        reports: dict[str, list[dict[str, Any]]] = handle.snapshot.remote().result(timeout_s=30)
        return reports

    def set_draining(self, draining: bool) -> None:
        """Drain (or undrain) the ingress replica."""
        handle = serve.get_deployment_handle(INGRESS_DEPLOYMENT, APP_NAME)
        handle.set_draining.remote(draining).result(timeout_s=30)

    def deployment(self, name: str, app_name: str = APP_NAME) -> dict[str, Any]:
        """Serve's REST details of one deployment of ``app_name`` (replicas with their
        nodes)."""
        app = self.rest.app_details(app_name) or {}
        details: dict[str, Any] = app.get("deployments", {}).get(name, {})
        return details

    def running_replicas(self, name: str, app_name: str = APP_NAME) -> list[dict[str, Any]]:
        """RUNNING replicas of deployment ``name`` of ``app_name`` (default: the shared app)."""
        replicas = self.deployment(name, app_name).get("replicas", [])
        return [r for r in replicas if r["state"] == "RUNNING"]

    def url(self, path: str) -> str:
        """Absolute URL of ``path`` on the endpoint."""
        return f"{self.endpoint}{path}"


@contextlib.contextmanager
def running_sim_cluster() -> Iterator[SimCluster]:
    """Head + prefill node + decode node, with the dashboard; torn down on exit."""
    before = set(descendant_pids(os.getpid()))
    dashboard_port = free_port()
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 4,
            "include_dashboard": True,
            "dashboard_host": "127.0.0.1",
            "dashboard_port": dashboard_port,
            "object_store_memory": 100 * _MIB,
        },
    )
    roots: list[int] = []
    try:
        prefill = cluster.add_node(
            num_cpus=2, labels=dict(PREFILL_LABEL), object_store_memory=80 * _MIB
        )
        decode = cluster.add_node(
            num_cpus=2, resources={DECODE_RESOURCE: 4}, object_store_memory=80 * _MIB
        )
        ray.init(address=cluster.address, namespace="pdserve-tests", log_to_driver=False)
        # the cluster's own processes; later children of this process (multiprocessing's
        # resource tracker lives as long as this process) are not the cluster's
        roots = [pid for pid in descendant_pids(os.getpid()) if pid not in before]
        yield SimCluster(
            cluster=cluster,
            dashboard_url=f"http://127.0.0.1:{dashboard_port}",
            head_node_id=cluster.head_node.node_id,
            prefill_node_id=prefill.node_id,
            decode_node_id=decode.node_id,
        )
    finally:
        if not roots:  # it failed while starting: whatever appeared since is the cluster's
            roots = [pid for pid in descendant_pids(os.getpid()) if pid not in before]
        started = {*roots, *(pid for root in roots for pid in descendant_pids(root))}
        try:
            if ray.is_initialized():
                _remove_apps(f"http://127.0.0.1:{dashboard_port}")
                serve.shutdown()  # stops whatever is left: controller, proxies, any app
        finally:
            ray.shutdown()  # also when a test's connection broke: the head cannot go otherwise
        cluster.shutdown()
        _assert_processes_gone(sorted(started))


def _remove_apps(dashboard_url: str) -> None:
    """Delete every Serve app at once, each replica draining gracefully (``serve.shutdown``
    would delete them in stages — ingress, then the pools, then the stats board — each stage
    paying a replica's 2 s graceful-shutdown wait loop)."""
    try:
        client = ServeSubmissionClient(dashboard_url)
        if client.get_serve_details().get("applications"):
            client.deploy_applications({"applications": []})
            wait_until(
                lambda: not client.get_serve_details().get("applications"),
                60,
                "every Serve app deleted",
            )
    except Exception:  # only a shortcut: serve.shutdown() after it stops what is left
        logger.warning("deleting the Serve apps before shutdown failed", exc_info=True)


def _assert_processes_gone(pids: list[int]) -> None:
    """Every process the cluster started (descendants of this test process) exits."""
    wait_until(
        lambda: not [pid for pid in pids if is_running(pid)],
        60,
        "Ray processes still alive after shutdown",
    )


def deploy_serving_app(sim_cluster: SimCluster, disk_dir: Path) -> ServingApp:
    """The shared app, deployed through Serve's REST API, with small host (write-through) and
    disk KV tiers (in ``disk_dir``) so finished prompts reach the disk tier at once."""
    tiers = app_tiers(str(disk_dir))
    config = load_cluster_config(app_config(free_port(), engine={"kv_tiers": tiers}))
    endpoint = deploy(config, sim_cluster.dashboard_url, timeout_s=300)
    return ServingApp(config, endpoint, ServeRest(sim_cluster.dashboard_url))


def reset_to_baseline(serving_app: ServingApp) -> None:
    """Back to 1 prefill + 1 decode, undrained, no KV in use."""
    serving_app.set_draining(False)
    pools = _pools(serving_app)
    counts = {name: len(pool.get("replicas", [])) for name, pool in pools.items()}
    targets = {int(pool.get("target_num_replicas", -1)) for pool in pools.values()}
    if any(count != 1 for count in counts.values()) or targets != {1}:
        serving_app.rest.scale(APP_NAME, dict.fromkeys(POOLS, 1))
    wait_until(lambda: _at_baseline(serving_app), 120, "app back to 1 prefill + 1 decode, idle")


POOLS = ("Prefill", "Decode")


def _pools(app: ServingApp) -> dict[str, dict[str, Any]]:
    """Serve's REST details of both pools, from one request (the test after each waits on
    this reset; every request serializes the details of every app)."""
    deployments = (app.rest.app_details(APP_NAME) or {}).get("deployments", {})
    return {name: deployments.get(name, {}) for name in POOLS}


def _at_baseline(app: ServingApp) -> bool:
    for pool in _pools(app).values():
        if len([r for r in pool.get("replicas", []) if r["state"] == "RUNNING"]) != 1:
            return False
    board = app.board()
    live = [r for role in ("prefill", "decode") for r in board.get(role, [])]
    idle = all(r["stats"]["kv_blocks_used"] == 0 for r in live)
    response = httpx.get(app.url("/ready"), timeout=10)
    ready = response.status_code == 200 and not response.json()["degraded"]
    return len(live) == 2 and idle and ready


def remove_app(serving_app: ServingApp, name: str, timeout_s: float = 120.0) -> None:
    """Remove an app deployed next to the shared one, and its KV index (a detached actor that
    would otherwise poll on for the rest of the session)."""
    serving_app.rest.remove(name)
    wait_until(lambda: serving_app.rest.app_details(name) is None, timeout_s, f"{name} removed")
    kill_index_actor(name)


@contextlib.contextmanager
def side_app(serving_app: ServingApp, config: ClusterConfig, route: str) -> Iterator[str]:
    """Deploy ``config``'s app next to the shared one (same proxy, under ``route``), wait until
    it answers ``/ready``, yield its endpoint; remove it (and its KV index) afterwards."""
    name = config.cluster.app_name
    rest = serving_app.rest
    others = {
        app_name: app["deployed_app_config"]
        for app_name, app in rest.details().get("applications", {}).items()
        if app_name != name and app.get("deployed_app_config")
    }
    assert APP_NAME in others
    schema = deploy_schema(config, others)
    for entry in schema["applications"]:
        if entry["name"] == name:
            entry["route_prefix"] = route
    ServeSubmissionClient(rest.dashboard_url).deploy_applications(schema)
    try:
        rest.wait_running(name, 180, poll_s=0.2)
        endpoint = f"{serving_app.endpoint}{route}"
        wait_until(
            lambda: httpx.get(f"{endpoint}/ready", timeout=10).status_code == 200,
            60,
            f"{name} ready",
        )
        yield endpoint
    finally:
        remove_app(serving_app, name)
