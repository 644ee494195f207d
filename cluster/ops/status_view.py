"""``pdserve status``: pools (per model), their replicas and nodes, KV use, transfers in flight.

Serve's REST details give each deployment's status, target and replicas (with node ids and
IPs); the stats board gives each live replica's worker ``stats()``; the ingress's ``/metrics``
give the control plane's recoveries it saw (restarts of the KV index, the stats board and
Serve's controller; the ingress's own start). :func:`collect_status`
joins them by replica id into plain dicts (``--json`` prints those), with the pools of a stepped
rollout's pools apps beside the app's own (a model's superseded pools, held at 0 after the
rollout finished, marked idle: ``cluster.ops.live_pools``); :func:`render_status`
draws them: within 80 columns by default (a block per pool, short headers, tiers on their own
line), or as one wide table (``--wide``, or any terminal of 120 columns and more).
"""

from __future__ import annotations

import time
from typing import Any

import httpx
from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from cluster.ops.board_calls import board_snapshot
from cluster.ops.live_pools import idle_deployments, pools_apps
from cluster.ops.ray_session import attached
from cluster.ops.rest import ServeRest
from cluster.ops.rollout_state import read_rollout
from cluster.ops.run_state import RunState
from cluster.planner.decisions import PlannerLog, decisions_key
from cluster.serve.pool_options import (
    DECODE_DEPLOYMENT,
    INGRESS_DEPLOYMENT,
    PREFILL_DEPLOYMENT,
    pool_of_deployment,
)
from core.codec import from_plain, to_plain
from core.errors import UnavailableError
from core.stats import ReplicaStats


def pool_rows(deployments: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """``(deployment, role, model)`` of every pool, model by model, then the ingress row (a
    one-model app's pools have no model suffix: model None)."""
    pools = []
    for name in deployments:
        parsed = pool_of_deployment(name)
        if parsed is not None:
            role, model = parsed
            pools.append((model, role != "prefill", name, role))
    if not pools:  # not deployed yet: the one-model rows, empty
        pools = [
            ("", False, PREFILL_DEPLOYMENT, "prefill"),
            ("", True, DECODE_DEPLOYMENT, "decode"),
        ]
    rows = [(name, role, model or None) for model, _, name, role in sorted(pools)]
    return [*rows, (INGRESS_DEPLOYMENT, "", None)]


def collect_status(state: RunState, with_stats: bool = True) -> dict[str, Any]:
    """Pools with their replicas, each with node and (when reporting) worker stats: the app's
    and its pools apps' (a stepped rollout's, whose replicas report to the app's board)."""
    with attached(state.ray_address, auth_mode=state.ray_auth_mode):
        apps: dict[str, Any] = ServeRest(state.dashboard_url).details().get("applications", {})
        app = apps.get(state.app_name)
        if app is None:
            raise UnavailableError(f"app {state.app_name} is not deployed at {state.dashboard_url}")
        reports = board_snapshot(state.app_name) if with_stats else {}
        planner = planner_log(state.app_name)
    return {
        "app": state.app_name,
        "status": app.get("status"),
        "endpoint": state.endpoint,
        "dashboard": state.dashboard_url,
        "pools": collect_pools(state.app_name, apps, reports),
        "planner": None if planner is None else to_plain(planner),
        "control_plane": control_plane(state.endpoint),
        "rollout": rollout_line(state.app_name),
    }


def collect_pools(
    app_name: str, apps: dict[str, Any], reports: dict[str, list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """The pools of ``app_name`` and of its deployed pools apps, each replica joined with its
    board report. A pools app's pool is named ``Decode@<app>`` (pool names stay unique); one
    that another app's serves in its place after a finished rollout is marked ``idle``."""
    by_replica = {r["replica_id"]: r for role in reports.values() for r in role}
    idle = idle_deployments(app_name)
    pools = []
    for app in [app_name, *pools_apps(app_name, apps)]:
        deployments: dict[str, Any] = (apps.get(app) or {}).get("deployments", {})
        rows = pool_rows(deployments)
        if app != app_name:  # a pools app: its pools only, as deployed
            rows = [row for row in rows if row[1] and row[0] in deployments]
        for deployment, role, model in rows:
            details = deployments.get(deployment, {})
            replicas = [
                {
                    "replica_id": r.get("replica_id"),
                    "state": r.get("state"),
                    "node_id": r.get("node_id"),
                    "node_ip": r.get("node_ip"),
                    "stats": by_replica.get(r.get("replica_id"), {}).get("stats"),
                }
                for r in details.get("replicas", [])
            ]
            pools.append(
                {
                    "pool": deployment if app == app_name else f"{deployment}@{app}",
                    "deployment": deployment,
                    "app": app,
                    "idle": deployment in idle.get(app, set()),
                    "role": role,
                    "model": model,
                    "status": details.get("status"),
                    "target_replicas": details.get("target_num_replicas"),
                    "replicas": replicas,
                }
            )
    return pools


def rollout_line(app_name: str) -> str | None:
    """``rollout of tiny-moe: step 3/8: Prefill 2 old + 1 new, ...`` while a stepped rollout
    is recorded (None: none)."""
    rollout = read_rollout(app_name)
    if rollout is None:
        return None
    return f"rollout of {rollout.model or app_name}: {rollout.progress_line()}"


CONTROL_PLANE_COUNTERS = {
    "kv_index_restarts": "pdserve:kv_index_restarts_total",
    "stats_board_restarts": "pdserve:stats_board_restarts_total",
    "serve_controller_restarts": "pdserve:serve_controller_restarts_total",
    "request_migrations": "pdserve:request_migrations_total",
}
"""What ``pdserve status`` shows of the control plane's recoveries: key -> the ingress's
counter."""

HOT_PREFIX_COUNTERS = {
    "hot_prefixes": "pdserve:hot_prefixes",
    "prefix_copies_made": "pdserve:prefix_copies_made_total",
    "prefix_copies_dropped": "pdserve:prefix_copies_dropped_total",
    "prefix_copy_bytes": "pdserve:prefix_copy_bytes_total",
}
"""The ``hot prefixes`` line of ``pdserve status``: key -> the ingress's metric (summed over
pools)."""


def control_plane(endpoint: str) -> dict[str, float] | None:
    """The ingress's recovery counters and its own start (``ingress_started_unix_s``); None
    when its ``/metrics`` cannot be read."""
    try:
        text = httpx.get(f"{endpoint}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    names = {
        **CONTROL_PLANE_COUNTERS,
        **HOT_PREFIX_COUNTERS,
        "ingress_started_unix_s": "process_start_time_seconds",
    }
    found = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for key, metric in names.items():
            if name == metric:
                found[key] += float(line.rsplit(" ", 1)[1])
    return found


def planner_log(app_name: str) -> PlannerLog | None:
    """The planner's recent decisions (needs an attached Ray driver); None when it has made
    none (mode ``off``, or nothing changed yet)."""
    from ray.experimental.internal_kv import _internal_kv_get

    data = _internal_kv_get(decisions_key(app_name))
    return None if data is None else PlannerLog.from_json(data)


WIDE_MIN_COLUMNS = 120
"""A terminal at least this wide gets the wide table without ``--wide``."""


def render_status(status: dict[str, Any], console: Console, wide: bool | None = None) -> None:
    """The status: a header, one row per replica (one block per pool in the narrow layout),
    and the planner's last decisions. ``wide`` None: by the console's width."""
    if wide is None:
        wide = console.width >= WIDE_MIN_COLUMNS
    if wide:
        _render_wide(status, console)
    else:
        _render_narrow(status, console)
    render_versions(status, console)
    if status.get("rollout"):
        console.print(status["rollout"], highlight=False)
    render_control_plane(status.get("control_plane"), console)
    if status.get("planner"):
        render_planner(from_plain(PlannerLog, status["planner"]), console)


def _stats_of(replica: dict[str, Any]) -> ReplicaStats | None:
    plain = replica["stats"]
    return None if plain is None else from_plain(ReplicaStats, plain)


def _pool_label(pool: dict[str, Any]) -> str:
    """``Decode (2/2)``, ``Decode@pdserve-rollout (2/2)``; ``idle`` for a pool held at 0 while
    another app's serves the model."""
    idle = " idle" if pool.get("idle") else ""
    return f"{pool['pool']} ({len(pool['replicas'])}/{pool['target_replicas']}){idle}"


def _render_wide(status: dict[str, Any], console: Console) -> None:
    """Everything on one line per replica (``--wide``)."""
    console.print(
        f"[bold]{status['app']}[/] {status['status']}  endpoint {status['endpoint']}  "
        f"dashboard {status['dashboard']}"
    )
    table = Table(
        "pool",
        "replica",
        "state",
        "node",
        "KV used/total",
        "tiers used/total (hits)",
        "running",
        "waiting",
        "xfers",
        "spec accept (drafts)",
        "KV fp",
        "LoRA adapters",
    )
    for pool in status["pools"]:
        label = _pool_label(pool)
        for i, replica in enumerate(pool["replicas"]):
            stats = _stats_of(replica)
            columns = (
                ["-"] * 7
                if stats is None
                else [
                    f"{stats.kv_blocks_used}/{stats.kv_blocks_total}",
                    tiers_cell(stats),
                    str(stats.num_running),
                    str(stats.num_waiting),
                    str(stats.transfer.in_flight),
                    spec_cell(stats),
                    fingerprint_cell(stats),
                    lora_cell(stats),
                ]
            )
            table.add_row(
                label if i == 0 else "",
                str(replica["replica_id"]),
                str(replica["state"]),
                str(replica["node_ip"] or replica["node_id"]),
                *columns,
            )
        if not pool["replicas"]:
            table.add_row(label, *["-"] * 10)
    # NOTE: asked for wide, it is never squeezed into the terminal: the lines run long instead
    # (rich clamps a print to the console's width, so the console widens for this one print)
    natural = Measurement.get(console, console.options.update_width(10_000), table).maximum
    terminal_width = console.width
    console.width = max(terminal_width, natural)
    try:
        console.print(table)
    finally:
        console.width = terminal_width


def _render_narrow(status: dict[str, Any], console: Console) -> None:
    """Fits 80 columns: the pool as a row of its own above its replicas, short headers, the
    KV tiers (when on) on a line under their replica."""
    console.print(f"[bold]{status['app']}[/] {status['status']}", highlight=False)
    console.print(f"  endpoint  {status['endpoint']}", highlight=False)
    console.print(f"  dashboard {status['dashboard']}", highlight=False)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for header in ("replica", "state", "node"):
        table.add_column(header, no_wrap=True)
    for header in ("KV", "run", "wait", "xfer"):
        table.add_column(header, justify="right", no_wrap=True)
    for pool in status["pools"]:
        table.add_row(f"[bold]{_pool_label(pool)}[/]", *[""] * 6)
        for replica in pool["replicas"]:
            stats = _stats_of(replica)
            columns = (
                ["-"] * 4
                if stats is None
                else [
                    f"{stats.kv_blocks_used}/{stats.kv_blocks_total}",
                    str(stats.num_running),
                    str(stats.num_waiting),
                    str(stats.transfer.in_flight),
                ]
            )
            table.add_row(
                f"  {replica['replica_id']}",
                str(replica["state"]),
                str(replica["node_ip"] or replica["node_id"]),
                *columns,
            )
            tiers = "off" if stats is None else tiers_cell(stats)
            if tiers != "off":
                table.add_row(f"    tiers {tiers}", *[""] * 6)
            spec = "off" if stats is None else spec_cell(stats)
            if spec != "off":
                table.add_row(f"    spec accept {spec}", *[""] * 6)
            fingerprint = "-" if stats is None else fingerprint_cell(stats)
            if fingerprint != "-":
                table.add_row(f"    KV fp {fingerprint}", *[""] * 6)
            loras = "off" if stats is None else lora_cell(stats)
            if loras != "off":
                table.add_row(f"    loras {loras}", *[""] * 6)
    console.print(table)


def render_control_plane(counters: dict[str, float] | None, console: Console) -> None:
    """One line: how long the ingress has been up and the restarts it saw."""
    if counters is None:
        console.print("control plane: ingress /metrics unreachable", highlight=False)
        return
    up_s = max(0.0, time.time() - counters["ingress_started_unix_s"])
    seen = ", ".join(
        f"{key.replace('_', ' ')} {int(counters[key])}" for key in CONTROL_PLANE_COUNTERS
    )
    console.print(f"control plane: ingress up {up_s:.0f} s; {seen}", highlight=False)
    render_hot_prefixes(counters, console)


def render_hot_prefixes(counters: dict[str, float], console: Console) -> None:
    """One line: prefixes deliberately copied now, copies made and dropped, bytes moved
    (nothing while no copy was ever made: the ``hot_prefix`` policy is off or idle)."""
    if not counters.get("prefix_copies_made"):
        return
    console.print(
        f"hot prefixes: {int(counters['hot_prefixes'])} copied now; copies made "
        f"{int(counters['prefix_copies_made'])}, dropped "
        f"{int(counters['prefix_copies_dropped'])}; "
        f"{counters['prefix_copy_bytes'] / 2**20:.1f} MiB moved",
        highlight=False,
    )


def render_planner(log: PlannerLog, console: Console, last: int = 5) -> None:
    """The planner's newest decisions, one line each."""
    console.print(f"[bold]planner[/] ({log.mode}), last decisions:")
    for d in log.decisions[-last:]:
        when = time.strftime("%H:%M:%S", time.localtime(d.unix_s))
        console.print(
            f"  {when} {d.pool} {d.previous} -> {d.target} ({d.reason}) {d.detail}",
            highlight=False,
        )


def tiers_cell(stats: ReplicaStats) -> str:
    """``host 120/4096 (37) disk 900/65536 (12)``: the lower KV tiers' blocks and hits."""
    lower = [t for t in stats.kv_tiers if t.medium != "device"]
    if not lower:
        return "off"
    return " ".join(
        f"{t.medium} {t.blocks_used}/{t.blocks_capacity} ({t.hits_total})" for t in lower
    )


def spec_cell(stats: ReplicaStats) -> str:
    """``2.85 (1204)``: speculative decoding's mean acceptance length (tokens per verify row)
    and how many verify rows ran; ``off`` when none did."""
    spec = stats.spec_decode
    if not spec.num_drafts:
        return "off"
    return f"{spec.mean_acceptance_length:.2f} ({spec.num_drafts})"


FINGERPRINT_DIGITS = 8


def fingerprint_cell(stats: ReplicaStats) -> str:
    """``3f9a0c12``: the replica's KV compatibility fingerprint, short (replicas of one
    fingerprint pair up; two in a pool mean a rolling upgrade is under way); ``-`` undeclared."""
    return stats.kv_fingerprint[:FINGERPRINT_DIGITS] or "-"


def versions_line(status: dict[str, Any]) -> str | None:
    """``upgrade in progress: Prefill 1 3f9a0c12 + 1 77b1e0d4; Decode 2 3f9a0c12``: each pool's
    replicas by short KV fingerprint, when the fleet runs more than one (None: one or none)."""
    pools: list[tuple[str, dict[str, int]]] = []
    for pool in status["pools"]:
        counts: dict[str, int] = {}
        for replica in pool["replicas"]:
            stats = _stats_of(replica)
            cell = "-" if stats is None else fingerprint_cell(stats)
            if cell != "-":
                counts[cell] = counts.get(cell, 0) + 1
        pools.append((str(pool["pool"]), counts))
    if len({fp for _, counts in pools for fp in counts}) < 2:
        return None
    parts = [
        f"{name} " + " + ".join(f"{n} {fp}" for fp, n in sorted(counts.items()))
        for name, counts in pools
        if counts
    ]
    return "upgrade in progress: " + "; ".join(parts)


def render_versions(status: dict[str, Any], console: Console) -> None:
    """:func:`versions_line`, when there is one."""
    line = versions_line(status)
    if line is not None:
        console.print(line, highlight=False)


def lora_cell(stats: ReplicaStats) -> str:
    """``sql:device chat:host +1 cold``: the LoRA adapters a replica serves and where each is
    (cold: served, loaded on its next request); ``off`` when it serves none."""
    if not stats.served_adapters and not stats.lora_adapters:
        return "off"
    loaded = [f"{a.name}:{a.residency}" for a in stats.lora_adapters]
    num_cold = len(set(stats.served_adapters) - {a.name for a in stats.lora_adapters})
    return " ".join([*loaded, *([f"+{num_cold} cold"] if num_cold else [])])
