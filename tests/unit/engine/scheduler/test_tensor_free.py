"""The scheduler and KV bookkeeping never import torch (vLLM v1 style: no tensors here)."""

from __future__ import annotations

import subprocess
import sys


def test_scheduler_and_kv_bookkeeping_do_not_import_torch() -> None:
    code = (
        "import sys, engine.scheduler, engine.kv, engine.request, core.kv_events; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"
