"""The public Serve ``import_path``: ``cluster.app:build_app``, and ``cluster.app:build_pools_app``
for a rolling upgrade's second app (the builders live in
``cluster.serve.app_builder``; this module keeps the documented path stable)."""

from cluster.serve.app_builder import (
    build_app,
    build_app_from_config,
    build_pools_app,
    build_pools_app_from_config,
)

__all__ = [
    "build_app",
    "build_app_from_config",
    "build_pools_app",
    "build_pools_app_from_config",
]
