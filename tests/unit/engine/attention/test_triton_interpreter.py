"""Run the Triton kernel checks (``triton_cases.py``) in a fresh process under the interpreter.

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

CASES = Path(__file__).with_name("triton_cases.py")
ROOT = Path(__file__).resolve().parents[4]
MIN_CASES = 38  # triton_cases.py holds 40; fewer passing means cases were lost or skipped
TIMEOUT_S = 240


def test_triton_kernels_match_reference_under_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", str(CASES), "-q", "-p", "no:cacheprovider"],
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
    assert int(passed.group(1)) >= MIN_CASES, report
    assert not re.search(r"\d+ (skipped|xfailed|deselected)", result.stdout), report
