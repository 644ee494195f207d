"""The fused-kernel checks (``fused_cases.py``) in a fresh process under the interpreter
(``tests/interpreted.py`` says why a subprocess)."""

from __future__ import annotations

from pathlib import Path

from tests.interpreted import run_interpreted_cases

MIN_CASES = 42  # fused_cases.py holds 42; fewer passing means cases were lost or skipped


def test_fused_kernels_match_torch_under_interpreter() -> None:
    run_interpreted_cases(Path(__file__).with_name("fused_cases.py"), MIN_CASES)
