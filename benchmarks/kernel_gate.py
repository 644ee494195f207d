"""The compile gate (issue 46): every Triton kernel the engine launches, compiled for sm_80, sm_90
(and sm_100 when the bundled ptxas has it) on this CPU-only machine, with the configurations the
launchers choose for a Llama-1B-, a Llama-8B- and a Qwen3-MoE-shaped model, bf16/fp16, KV
auto/int8/fp8_e4m3 (``engine.kernel_gate``). Each distinct build compiles once, in parallel;
Triton's cache (``TRITON_CACHE_DIR``) keeps them for the next run.

Prints one JSON line (``engine.kernel_gate.report.run_to_json``: every build's registers,
spill stack and shared memory, the failed checks) or, with ``--markdown``, the table of
``docs/benchmarks.md``. Exits 1 when a check fails: a compile error, shared memory over the
target's limit, or a spill.

``make test`` runs it for sm_80 and sm_90 only (``--targets sm_80,sm_90``): ptxas for sm_100 takes
most of a cold run's compile time (175 of 296 CPU-seconds here).

Usage: ``python benchmarks/kernel_gate.py [--markdown] [--workers N] [--targets sm_80,sm_90]``
"""

from __future__ import annotations

import argparse
import json
import sys

from engine.kernel_gate.compiler import available_workers
from engine.kernel_gate.gate import run_gate
from engine.kernel_gate.report import markdown_table, run_to_json
from engine.kernel_gate.targets import gate_targets


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the docs table")
    parser.add_argument("--workers", type=int, default=available_workers())
    parser.add_argument(
        "--targets", default="", help="comma-separated, e.g. sm_80,sm_90 (default: every one)"
    )
    args = parser.parse_args()
    try:
        targets = gate_targets(tuple(name for name in args.targets.split(",") if name))
    except ValueError as e:
        parser.error(str(e))
    run = run_gate(targets, args.workers)
    print(markdown_table(run) if args.markdown else json.dumps(run_to_json(run)))
    for finding in run.findings:
        print(finding, file=sys.stderr)
    return 1 if run.findings else 0


if __name__ == "__main__":
    sys.exit(main())
