"""``pdserve profile``: the typer command. Only typer/rich at import; torch loads on call."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from core.console import fail
from core.errors import PdserveError

console = Console()


def _lengths(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as e:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}") from e
    if not values or min(values) < 1:
        raise typer.BadParameter(f"lengths must be positive integers, got {text!r}")
    return values


def profile_command(
    config: str = typer.Argument(..., help="Cluster YAML (or a name under configs/)."),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Capacity model JSON (default: <config>.profile.json)."
    ),
    prompt_lens: str | None = typer.Option(
        None, "--prompt-lens", help="Prompt lengths to prefill, comma-separated."
    ),
    max_len: int | None = typer.Option(
        None, "--max-len", min=1, help="Cap every prompt and context length at this."
    ),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="Write a PNG per curve."),
) -> None:
    """Measure one prefill and one decode engine of this config on this machine (prefill
    tokens/s by prompt length and batch; decode ITL by concurrency and context) and write the
    capacity model planner.mode slo reads."""
    from cluster.planner.profile_plots import write_profile_plots
    from cluster.planner.profiler import default_grid, profile
    from cluster.serve.config_file import load_cluster_config, resolve_config_path

    try:
        cfg = load_cluster_config(config)
        source = resolve_config_path(config)
    except PdserveError as e:
        fail(e.message)
    path = output or source.with_name(source.stem + ".profile.json")
    grid = default_grid(_lengths(prompt_lens), max_len)
    model = profile(cfg, grid, progress=lambda line: console.print(line, highlight=False))
    model.save(path)
    console.print(f"wrote {path}")
    if plots:
        for png in write_profile_plots(model, path.with_suffix("")):
            console.print(f"wrote {png}")
