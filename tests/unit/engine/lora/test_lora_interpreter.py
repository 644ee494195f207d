"""The LoRA kernel checks (``lora_kernel_cases.py``) in a fresh process under the interpreter
(``tests/interpreted.py`` says why a subprocess)."""

from __future__ import annotations

from pathlib import Path

from tests.interpreted import run_interpreted_cases

MIN_CASES = 12  # lora_kernel_cases.py holds 12; fewer passing means cases were lost or skipped


def test_lora_kernels_match_torch_under_interpreter() -> None:
    run_interpreted_cases(Path(__file__).with_name("lora_kernel_cases.py"), MIN_CASES)
