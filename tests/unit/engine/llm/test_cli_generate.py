"""``pdserve generate``: output on success, a one-line error and non-zero exit on bad input."""

from __future__ import annotations

from typer.testing import CliRunner

from cluster.ops.cli import app


def test_generate_prints_outputs() -> None:
    result = CliRunner().invoke(
        app, ["generate", "--model", "builtin:tiny-llama", "--prompt", "hi", "--max-tokens", "4"]
    )
    assert result.exit_code == 0, result.output
    assert "tokens: 4 (length)" in result.output


def test_bad_input_exits_non_zero_without_traceback() -> None:
    runner = CliRunner()
    cases = [
        (["--model", "/no/such/dir"], "/no/such/dir"),
        (["--model", "builtin:tiny-llama", "--temperature", "-1"], "temperature"),
        (["--model", "builtin:tiny-llama", "--max-model-len", "999999"], "max_model_len"),
    ]
    for extra, needle in cases:
        result = runner.invoke(app, ["generate", "--prompt", "hi", *extra])
        assert result.exit_code == 2, result.output
        assert needle in result.output
        assert "Traceback" not in result.output
