"""Reads a cluster YAML (or an already-parsed mapping) into a validated ``ClusterConfig``.

The one boundary where YAML becomes the schema: pydantic's errors are folded into a single
``ConfigError`` whose message lists every offending field by its dotted path, and whose
``param`` names the first one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from core.config import ClusterConfig
from core.config.files import REPO_CONFIGS, read_yaml_mapping, resolve_yaml, validate_mapping


def resolve_config_path(name: str | Path) -> Path:
    """A YAML path, or a bare name of a file in the repo's ``configs/`` (``local``)."""
    return resolve_yaml(name, REPO_CONFIGS, kind="config", param="config")


def validate_cluster_config(data: Mapping[str, Any], source: str) -> ClusterConfig:
    """``ClusterConfig`` from a mapping; every field error named in one ConfigError."""
    return validate_mapping(ClusterConfig, data, kind="cluster config", source=source)


def load_cluster_config(source: str | Path | Mapping[str, Any]) -> ClusterConfig:
    """A path (or bare name under ``configs/``) or a mapping, validated."""
    if isinstance(source, Mapping):
        return validate_cluster_config(source, "mapping")
    path = resolve_config_path(source)
    data = read_yaml_mapping(path, kind="config", param="config")
    return validate_cluster_config(data, str(path))


def config_to_mapping(config: ClusterConfig) -> dict[str, Any]:
    """A JSON-ready mapping that :func:`load_cluster_config` turns back into ``config``.

    Only the keys set in the source are kept: a pool's ``engine:`` overrides mean "the keys
    given here", so dumping defaults would turn every default into an override.
    """
    return config.model_dump(mode="json", exclude_unset=True)
