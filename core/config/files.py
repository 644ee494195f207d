"""Reading config YAML files: find the file, read the mapping, validate it into a schema.

One loader for every kind of config (a cluster, a load-test workload), so every file error reads
the same way: a :class:`ConfigError` whose ``param`` names what the user passed or the first bad
field, and whose message lists every field error as ``dotted.path: message``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from core.errors import ConfigError

ModelT = TypeVar("ModelT", bound=BaseModel)

REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"
"""The repository's ``configs/`` directory: bare names (``local``, ``long-context-32k``) resolve
here (cluster configs) or in its ``loadtest/`` folder (workloads)."""


def resolve_yaml(name: str | Path, directory: Path, *, kind: str, param: str) -> Path:
    """``name`` if it is a file, else ``directory/<name>.yaml`` for a bare name (``local``)."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    candidate = directory / f"{name}.yaml"
    if not path.suffix and candidate.is_file():
        return candidate
    raise ConfigError(f"no {kind} file {str(name)!r}", param=param)


def read_yaml_mapping(path: Path, *, kind: str, param: str) -> dict[str, Any]:
    """The YAML mapping in ``path``; ConfigError when unreadable or not a mapping."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read {kind} {path}: {e}", param=param) from e
    if not isinstance(data, dict):
        raise ConfigError(f"{kind} {path} is not a YAML mapping", param=param)
    return data


def validate_mapping(
    schema: type[ModelT], data: Mapping[str, Any], *, kind: str, source: str
) -> ModelT:
    """``schema`` from ``data``; every field error named in one ConfigError."""
    try:
        return schema.model_validate(dict(data))
    except ValidationError as e:
        problems = [(_dotted(err["loc"]), err["msg"]) for err in e.errors()]
        listing = "; ".join(f"{loc}: {msg}" for loc, msg in problems)
        first = problems[0][0] if problems else None
        raise ConfigError(f"invalid {kind} ({source}): {listing}", param=first) from e


def _dotted(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "<root>"
