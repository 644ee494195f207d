"""Run the fused-kernel checks (``fused_cases.py``) in a fresh process under the interpreter.

Why a subprocess: Triton decides at import time whether ``@triton.jit`` compiles or interprets,
so ``TRITON_INTERPRET=1`` must be set before anything in the session imports triton (see
``tests/unit/engine/attention/test_triton_interpreter.py``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

CASES = Path(__file__).with_name("fused_cases.py")
ROOT = Path(__file__).resolve().parents[4]
MIN_CASES = 41  # fused_cases.py holds 41; fewer passing means cases were lost or skipped
TIMEOUT_S = 240


def test_fused_kernels_match_torch_under_interpreter() -> None:
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
