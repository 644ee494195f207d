"""Starting a local Ray for ``pdserve up`` or attaching to an existing cluster.

A local Ray is started in-process with ``ray.init`` (this process owns it: when it exits or
calls ``ray.shutdown()`` every Ray process it started stops with it — nothing else is
touched; :func:`stop_local_ray` also waits until they all have). The dashboard is always on:
deploys and live scaling go through Serve's REST API on it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from cluster.ops import process_tree
from core.config import RayClusterConfig
from core.errors import UnavailableError

logger = logging.getLogger(__name__)


_AUTH_MODE_VAR = "RAY_AUTH_MODE"
LOCAL_RAY_EXIT_TIMEOUT_S = 10.0
"""How long :func:`stop_local_ray` waits for the processes of the local Ray to exit."""


@dataclass(frozen=True)
class RaySession:
    """A Ray connection held by this process."""

    gcs_address: str
    dashboard_url: str
    owns_cluster: bool
    auth_mode: str | None = None
    """Ray's auth mode in this process after connecting (``token`` when tokens are on)."""


def _use_auth_mode(auth_mode: str | None) -> None:
    """Adopt the cluster's auth mode unless the user chose one (before Ray is imported:
    Ray reads it once)."""
    if auth_mode and _auth_mode() is None:
        os.environ[_AUTH_MODE_VAR] = auth_mode


def _no_auto_connect() -> None:
    """A command attaches explicitly and detaches when done; a Serve handle's background probe
    that outlives the detach must not connect Ray again on its own (that printed Ray's INFO
    lines into the command's output). Read by Ray when it is first imported."""
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")


def _auth_mode() -> str | None:
    # NOTE: Ray's own switch, read (and set, in attach) here only; pdserve's settings live in
    # core/env.py. A local ray.init turns token auth on for this process by setting it.
    return os.environ.get(_AUTH_MODE_VAR)


def start_local_ray(config: RayClusterConfig) -> RaySession:
    """Start a single-node Ray owned by this process, sized by ``config``."""
    import ray

    kwargs: dict[str, Any] = {
        "address": "local",
        "namespace": config.namespace,
        "num_cpus": config.num_cpus,
        "object_store_memory": config.object_store_memory_bytes,
        "include_dashboard": True,
        "dashboard_host": "127.0.0.1",
        "dashboard_port": config.dashboard_port,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
    }
    if config.resources:
        kwargs["resources"] = dict(config.resources)
    if config.labels:
        kwargs["labels"] = dict(config.labels)
    try:
        context = ray.init(**kwargs)
    except Exception as e:
        raise UnavailableError(f"cannot start a local Ray: {type(e).__name__}: {e}") from e
    quiet_ray_logs()
    dashboard = context.dashboard_url or f"127.0.0.1:{config.dashboard_port}"
    return RaySession(
        gcs_address=_gcs_address(context, ""),
        dashboard_url=dashboard if "://" in dashboard else f"http://{dashboard}",
        owns_cluster=True,
        auth_mode=_auth_mode(),
    )


def attach(address: str, namespace: str, auth_mode: str | None = None) -> RaySession:
    """Connect to a running cluster (``host:port`` GCS address, ``auto`` or ``ray://``).

    Ray enables token auth on its own only for ``auto``; for an explicit address of a cluster
    that uses tokens, pass the ``auth_mode`` its ``up`` recorded (unless the user set one).
    """
    _use_auth_mode(auth_mode)
    _no_auto_connect()
    import ray

    try:
        context = ray.init(
            address=address,
            namespace=namespace,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    except Exception as e:
        raise UnavailableError(f"cannot attach to Ray at {address}: {e}") from e
    quiet_ray_logs()
    dashboard = context.dashboard_url or ""
    return RaySession(
        gcs_address=_gcs_address(context, address),
        dashboard_url=dashboard if "://" in dashboard or not dashboard else f"http://{dashboard}",
        owns_cluster=False,
        auth_mode=_auth_mode(),
    )


def quiet_ray_logs() -> None:
    """Keep Ray's and Serve's INFO lines out of a CLI command's output (they stay in Ray's own
    log files). Serve configures its logger (INFO, its own stderr handler) when ``ray.serve`` is
    first imported, so it is imported here first and only then turned down."""
    import ray.serve  # noqa: F401  - configures the "ray.serve" logger, which is then lowered

    for name in ("ray", "ray.serve"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _gcs_address(context: Any, default: str) -> str:
    """The GCS ``host:port`` of an ``ray.init`` context."""
    return str(getattr(context, "address_info", {}).get("gcs_address") or default)


def shutdown() -> None:
    """Disconnect (and, when this process started the local Ray, stop it)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def stop_local_ray(exit_timeout_s: float = LOCAL_RAY_EXIT_TIMEOUT_S) -> None:
    """Stop the local Ray this process started and wait until every process of it (this
    process's descendants: GCS, raylet, dashboard, workers) has exited; SIGKILL those still
    running after ``exit_timeout_s``."""
    ray_processes = process_tree.descendants(os.getpid())
    shutdown()
    left = process_tree.wait_stopped(ray_processes, exit_timeout_s)
    if left:
        logger.warning(
            "killing %d Ray processes still running %.0fs after shutdown (pids %s)",
            len(left),
            exit_timeout_s,
            [process.pid for process in left],
        )
        process_tree.kill(left)


@contextmanager
def attached(
    address: str, namespace: str = "pdserve", auth_mode: str | None = None
) -> Iterator[RaySession]:
    """Attach for the duration of a block (this also loads the cluster's auth token, which
    the dashboard's REST API requires when token authentication is on). A process already
    connected keeps its connection and the block runs on it."""
    _use_auth_mode(auth_mode)
    _no_auto_connect()
    import ray

    if ray.is_initialized():
        yield RaySession(gcs_address=address, dashboard_url="", owns_cluster=False)
        return
    session = attach(address, namespace, auth_mode)
    try:
        yield session
    finally:
        shutdown()
