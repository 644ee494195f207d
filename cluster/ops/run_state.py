"""What a running ``pdserve up`` leaves behind for ``status``, ``scale`` and ``down``.

One small JSON file per app under ``<cache dir>/run/``: where the dashboard and the HTTP
endpoint are, the Ray address to attach to, and — when ``up`` started its own local Ray — the
pid of the process that owns that Ray (``down`` signals exactly that process, nothing else).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from core import env
from core.errors import ConfigError


@dataclass(frozen=True)
class RunState:
    """One deployed pdserve app as seen by the CLI."""

    app_name: str
    dashboard_url: str
    endpoint: str
    ray_address: str
    """GCS address (``host:port``) or ``ray://`` URL that ``status`` attaches to."""
    owner_pid: int | None = None
    """The process holding the local Ray this app runs on; None on an external cluster."""
    log_path: str | None = None
    """Where a detached ``up`` writes its output."""
    ray_auth_mode: str | None = None
    """``RAY_AUTH_MODE`` of the cluster (``token``): clients attaching by address need it."""
    owner_start_ticks: int | None = None
    """Start time of ``owner_pid`` (``/proc`` clock ticks): ``down`` never signals a later
    process that reuses the pid of an ``up`` that died without clearing this file."""


def run_dir() -> Path:
    """``<cache dir>/run``."""
    return env.cache_dir() / "run"


def state_path(app_name: str) -> Path:
    """The state file of ``app_name``."""
    return run_dir() / f"{app_name}.json"


def log_path(app_name: str) -> Path:
    """The log file of a detached ``up`` of ``app_name``."""
    return run_dir() / f"{app_name}.log"


def write_state(state: RunState) -> Path:
    """Write ``state`` atomically (readers never see half a file)."""
    return write_json(state_path(state.app_name), asdict(state))


def write_json(path: Path, plain: object) -> Path:
    """Write ``plain`` as JSON to ``path`` atomically (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(plain, indent=2))
    tmp.replace(path)
    return path


def read_state(app_name: str) -> RunState | None:
    """The state of ``app_name``, or None when no ``up`` recorded one."""
    path = state_path(app_name)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ConfigError(f"unreadable run state {path}: {e}", param="app") from e
    return RunState(**data)


def clear_state(app_name: str, owner_pid: int | None = None) -> None:
    """Remove the state file (only if it still belongs to ``owner_pid`` when given)."""
    current = read_state(app_name)
    if current is None:
        return
    if owner_pid is not None and current.owner_pid != owner_pid:
        return
    state_path(app_name).unlink(missing_ok=True)


def target(
    app_name: str, dashboard_url: str | None, ray_address: str
) -> tuple[str, str, str | None]:
    """Dashboard URL, Ray address and auth mode: explicit ones, else what ``up`` recorded."""
    if dashboard_url:
        return dashboard_url, ray_address, None
    state = read_state(app_name)
    if state is None:
        raise ConfigError(f"no running app {app_name!r} recorded; pass --dashboard", param="app")
    return state.dashboard_url, state.ray_address, state.ray_auth_mode
