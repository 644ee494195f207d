"""``pdserve up`` / ``down`` / ``scale``: deploy the app from its YAML and manage its lifetime.

``up`` on ``cluster.address: local`` starts a Ray owned by this process, deploys through
Serve's REST API, waits until ``/ready`` answers, records a :class:`RunState` and then holds
the Ray until SIGINT/SIGTERM; then it stops that Ray, waits until every process of it has
exited and removes what they left in ``/dev/shm`` (the replicas' KV segments, which a stopping
Ray gives them no time to unlink). ``--detach`` runs that same
foreground process in the background (its own session, output to a log file) and returns once
it is ready. On an existing cluster (``auto``, ``ray://``) ``up`` only deploys; in the
foreground it removes the app on Ctrl-C. ``down`` signals the recorded owner process (by pid)
and waits for it to exit, or removes the app through REST. Either way a stepped rollout's pools
apps (``cluster.ops.live_pools``) go with the app, and its recorded rollout is forgotten.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import httpx

from cluster.ops import live_pools, process_tree, rollout_state, run_state
from cluster.ops.ray_session import attach, attached, shutdown, start_local_ray, stop_local_ray
from cluster.ops.rest import ServeRest
from cluster.ops.run_state import RunState
from cluster.serve import planner_settings
from core.config import ClusterConfig
from core.errors import ConfigError, UnavailableError
from core.shared_memory import sweep_orphans

logger = logging.getLogger(__name__)

DEPLOY_TIMEOUT_S = 600.0
"""How long ``up`` waits for the app to run and answer ``/ready``."""


class StopRequested(BaseException):
    """SIGINT/SIGTERM in ``up``: raised in its main thread (a BaseException, so that no
    ``except Exception`` on the way swallows it)."""


def endpoint_of(config: ClusterConfig) -> str:
    """The base URL clients use."""
    host = config.server.host
    if config.cluster.address.startswith("ray://"):
        host = config.cluster.address.removeprefix("ray://").rsplit(":", 1)[0]
    elif host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    prefix = config.cluster.route_prefix.rstrip("/")
    return f"http://{host}:{config.server.port}{prefix}"


def wait_http_ready(
    endpoint: str, timeout_s: float, alive: Callable[[], bool] = lambda: True
) -> None:
    """Poll ``GET /ready`` until 200 with no degraded part (``up`` waits for the whole app as
    configured, not only for "a request would be served"); UnavailableError on timeout or when
    ``alive()`` fails."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline and alive():
        try:
            response = httpx.get(f"{endpoint}/ready", timeout=5.0)
            if response.status_code == 200 and not response.json().get("degraded"):
                return
            last = f"{response.status_code} {response.text[:200]}"
        except httpx.HTTPError as e:
            last = f"{type(e).__name__}: {e}"
        time.sleep(0.5)
    raise UnavailableError(f"{endpoint}/ready did not answer 200 ({last})")


def deploy(config: ClusterConfig, dashboard_url: str, timeout_s: float = DEPLOY_TIMEOUT_S) -> str:
    """Deploy ``config`` through REST and wait until it serves; returns the endpoint."""
    rest = ServeRest(dashboard_url)
    rest.deploy(config)
    rest.wait_running(config.cluster.app_name, timeout_s)
    endpoint = endpoint_of(config)
    wait_http_ready(endpoint, timeout_s)
    return endpoint


def run_foreground(config: ClusterConfig, on_ready: Callable[[RunState], None]) -> None:
    """Start (or join), deploy, call ``on_ready``, then hold until SIGINT/SIGTERM.

    NOTE: the stop handlers are installed once Ray is connected, because connecting installs
    Ray's own: a Python SIGTERM handler that exits at once, and the core worker's C++ one that
    prints a stack trace (``logging.cc ... SIGTERM received ... PC: @``) to this terminal
    before chaining on. Ours replace both, so a stop is quiet and always runs the cleanup.
    """
    cluster = config.cluster
    owner = process_tree.ref(os.getpid()) if cluster.is_local else None
    if cluster.is_local:
        session = start_local_ray(cluster)
    else:
        session = attach(cluster.address, cluster.namespace)  # also loads the auth token
    dashboard_url = session.dashboard_url if cluster.is_local else cluster.resolved_dashboard_url()
    ray_address = session.gcs_address if cluster.is_local else cluster.address
    try:
        _handle_stop_signals(_raise_stop)
        endpoint = deploy(config, dashboard_url)
        state = RunState(
            cluster.app_name,
            dashboard_url,
            endpoint,
            ray_address,
            owner.pid if owner else None,
            ray_auth_mode=session.auth_mode,
            owner_start_ticks=owner.start_ticks if owner else None,
        )
        run_state.write_state(state)
        on_ready(state)
        threading.Event().wait()
    except StopRequested:
        logger.info("stopping %s", cluster.app_name)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a 2nd Ctrl-C interrupts
        if cluster.is_local:
            stop_local_ray()
            sweep_orphans(expected=True)  # the replicas' KV segments: their processes are gone
        else:
            _remove_quietly(dashboard_url, cluster.app_name)
            shutdown()  # only disconnects
        rollout_state.clear_rollout(cluster.app_name)  # its apps went with the app
        run_state.clear_state(cluster.app_name, owner_pid=owner.pid if owner else None)


def _raise_stop(signum: int, _frame: FrameType | None) -> None:
    raise StopRequested(signal.Signals(signum).name)


def _handle_stop_signals(handler: Callable[[int, FrameType | None], None]) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def start_detached(config_path: Path, config: ClusterConfig) -> RunState:
    """Run ``pdserve up CONFIG`` in the background; return once it is ready."""
    app_name = config.cluster.app_name
    log_path = run_state.log_path(app_name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "cluster.ops.cli", "up", str(config_path)]
    with log_path.open("ab") as log:
        child = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + DEPLOY_TIMEOUT_S
    while time.monotonic() < deadline:
        state = run_state.read_state(app_name)
        if state is not None and state.owner_pid in (child.pid, None):
            return RunState(**{**state.__dict__, "log_path": str(log_path)})
        if child.poll() is not None:
            raise UnavailableError(f"pdserve up exited with {child.returncode}; see {log_path}")
        time.sleep(0.5)
    raise UnavailableError(f"pdserve up not ready after {DEPLOY_TIMEOUT_S:.0f}s; see {log_path}")


def down(
    app_name: str,
    dashboard_url: str | None = None,
    ray_address: str = "auto",
    timeout_s: float = 120.0,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Stop the app (and the local Ray that ``up`` started); returns what was done. A local
    ``up`` is waited for up to ``timeout_s`` on ``clock``."""
    state = run_state.read_state(app_name)
    if state is not None and state.owner_pid is not None and dashboard_url is None:
        stopped = _stop_owner(state.owner_pid, state.owner_start_ticks, timeout_s, clock)
        rollout_state.clear_rollout(app_name)  # its pools apps stopped with that Ray
        run_state.clear_state(app_name)
        if not stopped:
            return f"pdserve (pid {state.owner_pid}) was not running; cleared its run state"
        return f"stopped pdserve (pid {state.owner_pid}) and its local Ray"
    url, address, auth_mode = run_state.target(app_name, dashboard_url, ray_address)
    with attached(address, auth_mode=auth_mode):
        removed = remove_app(ServeRest(url), app_name)
        from cluster.routing.kv_index.actor import kill_index_actor  # imports ray: after attach

        kill_index_actor(app_name)
        planner_settings.forget(app_name)  # the Ray cluster outlives the app: clean its keys
    rollout_state.clear_rollout(app_name)
    run_state.clear_state(app_name)
    return f"removed app {', '.join(removed)} from {url}"


def remove_app(rest: ServeRest, app_name: str) -> list[str]:
    """Delete ``app_name`` and its pools apps (a stepped rollout's, recorded or named like
    one), pools apps first: their replicas report to the app's board. Returns the apps."""
    deployed = rest.details().get("applications", {})
    apps = [*live_pools.pools_apps(app_name, deployed), app_name]
    for app in apps:
        rest.remove(app)
    return apps


def _stop_owner(
    pid: int, start_ticks: int | None, timeout_s: float, clock: Callable[[], float]
) -> bool:
    """SIGTERM the ``up`` that recorded ``pid`` (started at ``start_ticks``) and wait until it
    has exited (a zombie has: its parent may never reap it). False when it was not running."""
    owner = process_tree.ref(pid)
    if owner is None or (start_ticks is not None and owner.start_ticks != start_ticks):
        return False  # gone, or its pid now belongs to another process
    try:
        os.kill(owner.pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    if process_tree.wait_stopped([owner], timeout_s, clock=clock):
        raise UnavailableError(f"pdserve (pid {pid}) did not stop within {timeout_s:.0f}s")
    return True


def _remove_quietly(dashboard_url: str, app_name: str) -> None:
    try:
        remove_app(ServeRest(dashboard_url), app_name)
    except (ConfigError, UnavailableError) as e:
        logger.warning("could not remove app %s: %s", app_name, e.message)
