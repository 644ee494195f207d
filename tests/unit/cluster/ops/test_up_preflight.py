"""``pdserve up`` resolves the served model before deploying anything: a bad GGUF file is refused
in one ``error:`` line naming it, and no Ray is started."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cluster.ops import launcher
from cluster.ops.cli import app

runner = CliRunner()


def test_a_truncated_gguf_is_refused_before_any_replica(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(8))  # the header stops mid-way
    config = tmp_path / "local.yaml"
    config.write_text(yaml.safe_dump({"model": {"name": str(model)}}))
    monkeypatch.setenv("PDSERVE_CACHE_DIR", str(tmp_path / "cache"))

    def no_deploy(*args: object, **kwargs: object) -> None:
        raise AssertionError("nothing may be deployed")

    monkeypatch.setattr(launcher, "run_foreground", no_deploy)
    result = runner.invoke(app, ["up", str(config)])
    assert result.exit_code == 2, result.output
    (line,) = [ln for ln in result.output.splitlines() if ln.strip()]
    assert line.startswith("error: GGUF file ") and str(model) in line and "truncated" in line
