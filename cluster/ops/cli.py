"""The ``pdserve`` command line: one typer app; each subcommand imports its heavy deps lazily."""

from __future__ import annotations

import enum
import logging
import sys

import typer

from cluster.ops.profile_command import profile_command
from cluster.ops.serve_commands import (
    down_command,
    scale_command,
    status_command,
    up_command,
    upgrade_command,
    validate_command,
)
from core.console import fail, print_error
from core.errors import PdserveError
from loadtest.bench_app import bench_app
from sizer.size_command import size_command


class DTypeChoice(enum.StrEnum):
    """``--dtype`` values."""

    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


app = typer.Typer(
    name="pdserve",
    help="Disaggregated prefill/decode LLM serving on Ray.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.command()
def generate(
    prompt: list[str] = typer.Option(..., "--prompt", help="Prompt text; repeat for a batch."),
    model: str = typer.Option("builtin:tiny-llama", "--model", help="Built-in name or HF dir."),
    max_tokens: int = typer.Option(32, "--max-tokens", help="New tokens per prompt."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k"),
    seed: int | None = typer.Option(None, "--seed", help="Per-request sampling seed."),
    dtype: DTypeChoice = typer.Option(DTypeChoice.auto, "--dtype", help="Weights and KV dtype."),
    max_model_len: int | None = typer.Option(None, "--max-model-len"),
) -> None:
    """Offline generation on the local engine (no server)."""
    from engine import LLM, SamplingParams

    try:
        params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed
        )
        llm = LLM(model=model, dtype=dtype.value, max_model_len=max_model_len)
        outputs = llm.generate(prompt, params, use_tqdm=False)
    except PdserveError as e:
        fail(e.message)
    for text, out in zip(prompt, outputs, strict=True):
        seq = out.outputs[0]
        typer.echo(f"prompt: {text!r}")
        typer.echo(f"output: {seq.text!r}")
        typer.echo(f"tokens: {len(seq.token_ids)} ({seq.finish_reason})")


app.add_typer(bench_app, name="bench")
app.command("size")(size_command)
app.command("profile")(profile_command)
app.command("up")(up_command)
app.command("down")(down_command)
app.command("status")(status_command)
app.command("scale")(scale_command)
app.command("upgrade")(upgrade_command)
app.command("validate")(validate_command)


def main() -> None:
    """Console-script entry point."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except PdserveError as e:  # pragma: no cover - defensive: commands catch their own
        print_error(e.message)
        sys.exit(2)
    except ModuleNotFoundError as e:
        # NOTE: the base install is the client side (bench, size, validate); a command that
        # loads the serving stack on call says what to install instead of a traceback.
        print_error(
            f"{e.name} is not installed: this command needs the serving stack "
            "(pip install 'pdserve[serve]')"
        )
        sys.exit(2)


if __name__ == "__main__":
    main()
