"""Unit tests run without Ray: the root ``conftest`` loads the cluster fixtures (Ray, the
launcher) only for the suites that ask for them, so a machine without Ray (the GPU check's)
can run the unit and GPU suites."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

RUN_PYTEST_WITHOUT_RAY = """
import sys
sys.modules["ray"] = None  # an ImportError for anything that imports it
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
"""


def test_core_unit_tests_pass_with_ray_unimportable() -> None:
    done = subprocess.run(
        [sys.executable, "-c", RUN_PYTEST_WITHOUT_RAY, "tests/unit/core"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout
