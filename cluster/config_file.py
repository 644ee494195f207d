"""Reads a cluster YAML (or an already-parsed mapping) into a validated ``ClusterConfig``.

The one boundary where YAML becomes the schema: pydantic's errors are folded into a single
``ConfigError`` whose message lists every offending field by its dotted path, and whose
``param`` names the first one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from core.config import ClusterConfig
from core.errors import ConfigError

REPO_CONFIGS = Path(__file__).resolve().parent.parent / "configs"
"""The repository's ``configs/`` directory (bare names like ``local`` resolve here)."""


def resolve_config_path(name: str | Path) -> Path:
    """A YAML path, or a bare name of a file in the repo's ``configs/`` (``local``)."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    candidate = REPO_CONFIGS / f"{name}.yaml"
    if not path.suffix and candidate.is_file():
        return candidate
    raise ConfigError(f"no config file {str(name)!r}", param="config")


def read_config_mapping(path: Path) -> dict[str, Any]:
    """The YAML mapping in ``path``; ConfigError when unreadable or not a mapping."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read config {path}: {e}", param="config") from e
    if not isinstance(data, dict):
        raise ConfigError(f"config {path} is not a YAML mapping", param="config")
    return data


def validate_cluster_config(data: Mapping[str, Any], source: str) -> ClusterConfig:
    """``ClusterConfig`` from a mapping; every field error named in one ConfigError."""
    try:
        return ClusterConfig.model_validate(dict(data))
    except ValidationError as e:
        problems = [(_dotted(err["loc"]), err["msg"]) for err in e.errors()]
        listing = "; ".join(f"{loc}: {msg}" for loc, msg in problems)
        first = problems[0][0] if problems else None
        raise ConfigError(f"invalid cluster config ({source}): {listing}", param=first) from e


def load_cluster_config(source: str | Path | Mapping[str, Any]) -> ClusterConfig:
    """A path (or bare name under ``configs/``) or a mapping, validated."""
    if isinstance(source, Mapping):
        return validate_cluster_config(source, "mapping")
    path = resolve_config_path(source)
    return validate_cluster_config(read_config_mapping(path), str(path))


def config_to_mapping(config: ClusterConfig) -> dict[str, Any]:
    """A JSON-ready mapping that :func:`load_cluster_config` turns back into ``config``.

    Only the keys set in the source are kept: a pool's ``engine:`` overrides mean "the keys
    given here", so dumping defaults would turn every default into an override.
    """
    return config.model_dump(mode="json", exclude_unset=True)


def _dotted(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "<root>"
