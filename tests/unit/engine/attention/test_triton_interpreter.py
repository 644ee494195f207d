"""The Triton attention kernel checks (``triton_cases.py``) in a fresh process under the
interpreter (``tests/interpreted.py`` says why a subprocess)."""

from __future__ import annotations

from pathlib import Path

from tests.interpreted import run_interpreted_cases

MIN_CASES = 45  # triton_cases.py holds 47; fewer passing means cases were lost or skipped


def test_triton_kernels_match_reference_under_interpreter() -> None:
    run_interpreted_cases(Path(__file__).with_name("triton_cases.py"), MIN_CASES)
