"""Run a file of Triton kernel checks in a fresh process under Triton's interpreter.

Why a subprocess: Triton decides at import time whether ``@triton.jit`` compiles or interprets —
``TRITON_INTERPRET=1`` must be in the environment before triton (including its own standard
library of jit functions) is first imported. Inside a pytest session that is not ours to control:
any test collected earlier that imports ``engine`` imports triton too, and a conftest that sets
the variable afterwards has no effect. A child process with the variable set from the start
always gets interpreted kernels, whatever the rest of the session imported.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240


def run_interpreted_cases(cases: Path, min_cases: int) -> None:
    """Run ``cases`` under the interpreter; fail unless all pass, at least ``min_cases`` of
    them (fewer means cases were lost), and none was skipped or deselected."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(cases), "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    report = result.stdout[-6000:] + result.stderr[-2000:]
    assert result.returncode == 0, report
    passed = re.search(r"(\d+) passed", result.stdout)
    assert passed is not None, report
    assert int(passed.group(1)) >= min_cases, report
    assert not re.search(r"\d+ (skipped|xfailed|deselected)", result.stdout), report
