"""``pdserve validate`` refuses a pool's ``tensor_parallel_size`` the engine would refuse for the
model, naming the numbers (the one rule of ``core.tensor_parallel``, as ``pdserve size``)."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from cluster.ops.cli import app

runner = CliRunner()


def config_file(tmp_path: Path, model: str, size: int) -> str:
    config = {
        "model": {"name": model},
        "prefill": {"num_replicas": 0},
        "decode": {"num_replicas": 1, "engine": {"tensor_parallel_size": size}},
    }
    path = tmp_path / "tp.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_a_size_that_splits_the_heads_is_accepted(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", config_file(tmp_path, "Qwen2.5-7B", 4)])
    assert result.exit_code == 0, result.output
    assert "ok" in result.output and "decode x1" in result.output


def test_a_size_that_does_not_split_the_heads_is_refused_naming_them(tmp_path: Path) -> None:
    result = runner.invoke(app, ["validate", config_file(tmp_path, "Qwen2.5-7B", 8)])
    assert result.exit_code != 0
    assert "tensor_parallel_size=8 does not divide the 28 attention heads" in result.output


def test_a_model_not_on_this_machine_is_noted_not_refused(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-model")
    result = runner.invoke(app, ["validate", config_file(tmp_path, missing, 2)])
    assert result.exit_code == 0, result.output
    assert "decode.engine.tensor_parallel_size (2) not checked" in result.output
