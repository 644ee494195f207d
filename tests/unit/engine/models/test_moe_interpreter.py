"""The fused MoE checks (``moe_cases.py``) in a fresh process under the interpreter
(``tests/interpreted.py`` says why a subprocess)."""

from __future__ import annotations

from pathlib import Path

from tests.interpreted import run_interpreted_cases

MIN_CASES = 20  # moe_cases.py holds 20; fewer passing means cases were lost or skipped


def test_fused_moe_matches_torch_under_interpreter() -> None:
    run_interpreted_cases(Path(__file__).with_name("moe_cases.py"), MIN_CASES)
