"""The serving subcommands of ``pdserve``: ``up``, ``down``, ``status``, ``scale``, ``validate``.

Registered on the main typer app in ``cluster/cli.py``. Everything heavy (Ray, Serve, torch)
is imported inside the commands so ``pdserve --help`` stays fast.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from core.console import fail
from core.errors import ConfigError, PdserveError

if TYPE_CHECKING:
    from core.config import ServedModel

_APP_HELP = "Serve application name (cluster.app_name of the config)."
console = Console()
err_console = Console(stderr=True)


def validate_command(
    config: str = typer.Argument(..., help="Cluster YAML (or a name under configs/)."),
) -> None:
    """Check a cluster YAML against the schema; print a summary or every field error."""
    from cluster.serve.config_file import load_cluster_config

    try:
        cfg = load_cluster_config(config)
        notes = [note for served in cfg.served_models() for note in _check_splits(served)]
    except PdserveError as e:
        fail(e.message)
        return
    models = "; ".join(
        f"model {served.name} ({served.model.name}): " + ", ".join(
            f"{role} x{pool.initial_replicas}"
            + (f" (autoscale {pool.autoscaling.min_replicas}-{pool.autoscaling.max_replicas})"
               if pool.autoscaling else "")
            for role, pool in (("prefill", served.prefill), ("decode", served.decode))
        )
        for served in cfg.served_models()
    )  # fmt: skip
    virtual = "".join(f"; virtual model {v.name}" for v in cfg.virtual_models)
    console.print(
        f"[green]ok[/] {config}: {models}{virtual}, "
        f"ray {cfg.cluster.address}, http {cfg.server.host}:{cfg.server.port}",
        highlight=False,
    )
    for note in notes:
        console.print(f"note: {note}", highlight=False)


def _check_splits(served: ServedModel) -> list[str]:
    """Refuse a pool's ``tensor_parallel_size`` that the engine would refuse for this model
    (:mod:`core.tensor_parallel`, as ``pdserve size`` does); notes for the sizes not checked
    because the model's ``config.json`` is not on this machine."""
    from core.tensor_parallel import tp_split_problem
    from sizer.model_dir import load_model_shape

    notes = []
    for role in ("prefill", "decode"):
        size = served.engine_for(role).tensor_parallel_size
        if size == 1:
            continue
        try:
            shape = load_model_shape(served.model.name)
        except PdserveError as e:
            notes.append(f"{role}.engine.tensor_parallel_size ({size}) not checked: {e.message}")
            continue
        problem = tp_split_problem(size, shape.num_attention_heads, shape.num_kv_heads)
        if problem is not None:
            raise ConfigError(
                f"model {served.name} ({served.model.name}): {role}.engine.{problem}",
                param="tensor_parallel_size",
            )
    return notes


def up_command(
    config: str = typer.Argument(..., help="Cluster YAML (or a name under configs/)."),
    detach: bool = typer.Option(False, "--detach", help="Leave it running in the background."),
) -> None:
    """Start (or join) Ray, deploy the pools and the OpenAI endpoint, serve until Ctrl-C."""
    from cluster.ops import launcher
    from cluster.ops.model_check import check_models
    from cluster.serve.config_file import load_cluster_config, resolve_config_path

    try:
        cfg = load_cluster_config(config)
        check_models(cfg)
        if detach and cfg.cluster.is_local:
            state = launcher.start_detached(resolve_config_path(config).resolve(), cfg)
            console.print(f"pdserve is up at [bold]{state.endpoint}[/] (log: {state.log_path})")
            console.print("stop it with: pdserve down")
            return
        if detach:
            endpoint = launcher.deploy(cfg, cfg.cluster.resolved_dashboard_url())
            console.print(f"pdserve is up at [bold]{endpoint}[/]")
            return
        launcher.run_foreground(
            cfg,
            lambda state: console.print(
                f"pdserve is up at [bold]{state.endpoint}[/]  (Ctrl-C to stop)", highlight=False
            ),
        )
    except PdserveError as e:
        fail(e.message)


def down_command(
    app_name: str = typer.Option("pdserve", "--app", help=_APP_HELP),
    dashboard: str | None = typer.Option(
        None, "--dashboard", help="Ray dashboard URL (default: the one `up` recorded)."
    ),
    address: str = typer.Option("auto", "--address", help="Ray address with --dashboard."),
) -> None:
    """Stop the app; also stops the local Ray that `pdserve up` started (returns once it has)."""
    from cluster.ops import launcher

    try:
        console.print(launcher.down(app_name, dashboard, address))
    except PdserveError as e:
        fail(e.message)


def scale_command(
    prefill: int | None = typer.Option(None, "--prefill", min=0, help="Prefill replicas."),
    decode: int | None = typer.Option(None, "--decode", min=1, help="Decode replicas."),
    model: str | None = typer.Option(
        None, "--model", help="The served model whose pools to scale (apps serving several)."
    ),
    app_name: str = typer.Option("pdserve", "--app", help=_APP_HELP),
    dashboard: str | None = typer.Option(None, "--dashboard", help="Ray dashboard URL."),
    address: str = typer.Option("auto", "--address", help="Ray address with --dashboard."),
) -> None:
    """Resize the pools live (one model's, with --model): replicas are added or drained in
    place, none restarts."""
    from cluster.ops import scaling

    try:
        scaled = scaling.scale(app_name, prefill, decode, dashboard, address, model)
    except PdserveError as e:
        fail(e.message)
        return
    asked = ", ".join(f"{name} -> {count}" for name, count in scaled.replicas.items())
    console.print(f"scaling {scaled.app_name}: {asked}")


def upgrade_command(
    config: str | None = typer.Argument(
        None, help="The new cluster YAML (or a name under configs/); not with the rollout flags."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan, change nothing."),
    stepped: bool = typer.Option(
        False,
        "--stepped",
        help="Replace a model's pools as a stepped rollout (a second app, one replica per "
        "step, the P:D ratio kept) instead of a redeploy.",
    ),
    pause: bool = typer.Option(
        False, "--pause", help="Stop the stepped rollout after the step under way."
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Drive a paused or stopped rollout on from the step reached."
    ),
    rollback: bool = typer.Option(
        False, "--rollback", help="Walk the rollout's steps back until only the old version serves."
    ),
    drain_timeout_s: float | None = typer.Option(
        None,
        "--drain-timeout",
        min=0.0,
        help="Seconds a pool that lost a replica may take to finish its requests, then they "
        "migrate (default: cluster.ops.rollout.DRAIN_TIMEOUT_S).",
    ),
    app_name: str = typer.Option("pdserve", "--app", help=_APP_HELP),
) -> None:
    """Move the running app to a new YAML: pool sizes and the ingress's own settings in place, a
    new checkpoint or engine options by replacing the model's replicas while the old ones
    serve; --pause, --resume and --rollback steer a stepped rollout."""
    steering = [flag for flag, on in (("--pause", pause), ("--resume", resume),
                                      ("--rollback", rollback)) if on]  # fmt: skip
    if config is not None and not steering:
        _upgrade_to(config, dry_run, stepped, drain_timeout_s)
    elif len(steering) == 1 and config is None and not dry_run and not stepped:
        _steer_rollout(steering[0], app_name, drain_timeout_s)
    else:
        fail("give a new config, or one of --pause, --resume, --rollback")


def _steer_rollout(flag: str, app_name: str, drain_timeout_s: float | None) -> None:
    from cluster.ops import upgrade_rollout
    from cluster.ops.rollout import RolloutTimeouts

    try:
        if flag == "--pause":
            state = upgrade_rollout.pause(app_name)
            console.print(f"pausing after the step under way: {state.progress_line()}")
            return
        timeouts = RolloutTimeouts()
        if drain_timeout_s is not None:
            timeouts = RolloutTimeouts(drain_timeout_s=drain_timeout_s)
        steer = upgrade_rollout.resume if flag == "--resume" else upgrade_rollout.rollback
        state = steer(app_name, timeouts)
    except PdserveError as e:
        fail(e.message)
        return
    console.print(state.progress_line(), highlight=False)


def _upgrade_to(config: str, dry_run: bool, stepped: bool, drain_timeout_s: float | None) -> None:
    from cluster.ops.rollout import RolloutTimeouts
    from cluster.ops.upgrade import upgrade
    from cluster.serve.config_file import load_cluster_config

    timeouts = RolloutTimeouts()
    if drain_timeout_s is not None:
        timeouts = RolloutTimeouts(drain_timeout_s=drain_timeout_s)
    try:
        cfg = load_cluster_config(config)
        plan = upgrade(cfg, dry_run=dry_run, stepped=stepped, timeouts=timeouts)
    except PdserveError as e:
        fail(e.message)
        return
    if plan.empty:
        console.print("nothing to upgrade: the app runs this config")
        return
    for model in plan.models:
        what = ", ".join(model.restart_reasons) or "no restart"
        sizes = f"prefill -> {model.num_prefill} " if model.num_prefill is not None else ""
        sizes += f"decode -> {model.num_decode}" if model.num_decode is not None else ""
        console.print(f"{model.name}: {what} {sizes}".rstrip(), highlight=False)
    if plan.ingress_fields:
        applied = ", ".join(plan.ingress_fields)
        console.print(f"in place (no replica restarts): {applied}", highlight=False)
    if plan.redeploy_fields:
        console.print(f"with the redeploy: {', '.join(plan.redeploy_fields)}", highlight=False)
    if stepped and plan.restarts and not dry_run:
        from cluster.ops.status_view import rollout_line

        console.print(rollout_line(cfg.cluster.app_name) or "", highlight=False)
        return
    console.print("dry run: nothing changed" if dry_run else "upgraded")


def status_command(
    app_name: str = typer.Option("pdserve", "--app", help=_APP_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    no_stats: bool = typer.Option(False, "--no-stats", help="Skip per-replica worker stats."),
    wide: bool = typer.Option(
        False, "--wide", help="One wide table with every column (default: fit the terminal)."
    ),
) -> None:
    """Pools, replicas and their nodes, KV usage and transfers in flight."""
    from cluster.ops import run_state
    from cluster.ops.status_view import collect_status, render_status

    try:
        state = run_state.read_state(app_name)
        if state is None:
            raise PdserveError(f"no running app {app_name!r} recorded (start it with pdserve up)")
        status = collect_status(state, with_stats=not no_stats)
    except PdserveError as e:
        fail(e.message)
        return
    if as_json:
        typer.echo(json.dumps(status, indent=2))
    else:
        render_status(status, console, wide=True if wide else None)
