"""Control-plane drills: SIGKILL one piece of a running pdserve app from a Ray driver, as an
operator's game day would (the chaos suite and ``benchmarks/soak.py --faults control-plane``
use them).

Each drill kills with Ray (``ray.kill``: the process dies at once, no cleanup runs) and says what
it killed. What comes back and how: the KV index actor is restarted by Ray (``max_restarts``) and
refilled by the replicas' event pumps; Serve replaces a killed replica of a deployment (the
stats board, the ingress, a prefill or decode replica); Serve's controller is restarted by Ray
and recovers its state from the GCS, while proxies and handles keep routing to the replicas they
know. The data path's own faults (transfers failing or stalling) are ``/admin/faults``.
"""

from __future__ import annotations

import logging
from typing import Literal, get_args

import ray
from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

from cluster.routing.kv_index.actor import INDEX_NAMESPACE, index_actor_name
from cluster.serve.pool_options import (
    BOARD_DEPLOYMENT,
    DECODE_DEPLOYMENT,
    INGRESS_DEPLOYMENT,
    PREFILL_DEPLOYMENT,
)
from core.errors import UnavailableError

logger = logging.getLogger(__name__)

ControlPlaneFault = Literal[
    "kv_index", "stats_board", "serve_controller", "ingress", "prefill_replica"
]
CONTROL_PLANE_FAULTS: tuple[ControlPlaneFault, ...] = get_args(ControlPlaneFault)

_DEPLOYMENTS = {
    "stats_board": BOARD_DEPLOYMENT,
    "ingress": INGRESS_DEPLOYMENT,
    "prefill_replica": PREFILL_DEPLOYMENT,
    "decode_replica": DECODE_DEPLOYMENT,
}


def replica_actor_names(app_name: str, deployment: str) -> list[str]:
    """Serve's actor names of the live replicas of ``app_name``'s ``deployment``."""
    prefix = f"{app_name}#{deployment}#"  # after Serve's "SERVE_REPLICA::"
    return sorted(
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == SERVE_NAMESPACE
        and actor["name"].rpartition("::")[2].startswith(prefix)
    )


def kill_replica(app_name: str, deployment: str) -> str:
    """Kill one replica of ``deployment`` (Serve starts a replacement); :class:`UnavailableError`
    when it has none."""
    names = replica_actor_names(app_name, deployment)
    if not names:
        raise UnavailableError(f"{app_name} has no live {deployment} replica to kill")
    ray.kill(ray.get_actor(names[0], namespace=SERVE_NAMESPACE), no_restart=True)
    return f"killed {names[0]}"


def kill_kv_index(app_name: str, num_shards: int = 1) -> str:
    """Kill the app's KV index actor (the first of ``num_shards`` shards); Ray restarts it
    empty."""
    name = index_actor_name(app_name, 0, num_shards)
    ray.kill(ray.get_actor(name, namespace=INDEX_NAMESPACE), no_restart=False)
    return f"killed {name}"


def kill_serve_controller() -> str:
    """Kill Serve's controller; Ray restarts it and it recovers the apps from the GCS."""
    ray.kill(ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE), no_restart=False)
    return f"killed {SERVE_CONTROLLER_NAME}"


def run_drill(app_name: str, fault: ControlPlaneFault) -> str:
    """Inject ``fault`` into ``app_name``; what was killed."""
    logger.warning("drill: %s of %s", fault, app_name)
    if fault == "kv_index":
        return kill_kv_index(app_name)
    if fault == "serve_controller":
        return kill_serve_controller()
    return kill_replica(app_name, _DEPLOYMENTS[fault])
