"""The client side works on an install without the serving stack: ``pdserve bench``, ``pdserve
size`` and ``pdserve validate`` run with Ray, torch, gRPC and FastAPI unimportable, and a serving
command says what to install instead of printing a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
SERVING_STACK = (
    "ray",
    "torch",
    "triton",
    "grpc",
    "grpc_health",
    "fastapi",
    "starlette",
    "transformers",
    "xgrammar",
    "safetensors",
    "jinja2",
    "xxhash",
)

# Each blocked name imports as an ImportError, as on a machine where it was never installed.
RUN_CLI = f"""
import sys
for name in {SERVING_STACK!r}:
    sys.modules[name] = None
sys.argv = ["pdserve", *sys.argv[1:]]
from cluster.ops.cli import main
try:
    main()
finally:
    loaded = sorted(n for n in {SERVING_STACK!r} if sys.modules.get(n) is not None)
    print("loaded:", loaded, file=sys.stderr)
"""


def pdserve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", RUN_CLI, *args],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "100", "PYTHONPATH": str(REPO)},
    )


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("bench", "--help"),
        ("size", "--model", "Qwen2.5-7B", "--json"),
        ("validate", "configs/local.yaml"),
    ],
    ids=["help", "bench-help", "size", "validate"],
)
def test_client_commands_need_no_serving_stack(args: tuple[str, ...]) -> None:
    done = pdserve(*args)
    assert done.returncode == 0, done.stderr
    assert "loaded: []" in done.stderr


def test_a_serving_command_names_what_to_install() -> None:
    done = pdserve("generate", "--prompt", "hi")
    assert done.returncode == 2
    assert "pip install 'pdserve[serve]'" in done.stderr
    assert "Traceback" not in done.stderr
