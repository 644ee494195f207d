"""An app under a route prefix: the deploy schema and the endpoint clients use carry it."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cluster.ops.deploy_schema import app_schema
from cluster.ops.launcher import endpoint_of
from core.config import ClusterConfig


def _config(prefix: str | None) -> ClusterConfig:
    cluster = {} if prefix is None else {"route_prefix": prefix}
    return ClusterConfig.model_validate({"model": {"name": "builtin:tiny-moe"}, "cluster": cluster})


def test_the_prefix_reaches_the_schema_and_the_endpoint() -> None:
    assert app_schema(_config(None))["route_prefix"] == "/"
    assert endpoint_of(_config(None)) == "http://127.0.0.1:8000"
    assert app_schema(_config("/team-a"))["route_prefix"] == "/team-a"
    assert endpoint_of(_config("/team-a")) == "http://127.0.0.1:8000/team-a"


@pytest.mark.parametrize("bad", ["team-a", "/team a", "/a//b", "/a/"])
def test_a_malformed_prefix_is_refused(bad: str) -> None:
    with pytest.raises(ValidationError, match="route_prefix"):
        _config(bad)
