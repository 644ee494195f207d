"""Every GPU check of the engine in one command, summed up in a short table.

1. pytest on ``tests/gpu`` (Triton kernels on fresh random inputs, engine parity with HF on CUDA,
   CUDA-graph replay, KV staging) plus the unit tests whose code paths change on CUDA
   (``tests/unit/decode/test_host_staging.py``: prefill -> decode through the pinned host mirror);
   JUnit XML goes to ``--out``.
2. ``benchmarks/gpu_engine.py``; its JSON goes to ``--out``; with ``--moe`` also
   ``benchmarks/gpu_moe.py`` (writes the 10 GB ``builtin:gpu-moe`` on first use).

Prints pass/fail/skip counts per test module and the benchmark's headline numbers against their
targets. Exit status 0 only when no test failed or was skipped (on a GPU nothing may skip) and
the benchmark printed its JSON; without CUDA it stops at once with a message.

Usage: ``python benchmarks/gpu_check.py [--out DIR] [--skip-tests] [--skip-bench] [--moe]
[-- ARGS]`` (``ARGS`` go to ``gpu_engine.py``, e.g. ``-- --repeats 5 --compile``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TEST_PATHS = ["tests/gpu", "tests/unit/decode/test_host_staging.py"]
HEADLINES = [
    ("tpot_b1_ms", ""),
    ("tpot_b1_ratio", "<= 0.5"),
    ("throughput_b64_ratio", ">= 3"),
    ("bandwidth_utilisation_b1", ">= 0.7"),
    ("decode_attention_us_b1", "<= 5"),
    ("host_waits_per_step", "<= 1"),
    ("sync_free_decode_step", ""),
    ("prefill_tflops_ratio", ">= 0.5"),
    ("engine_build_s", ""),
    ("roofline_tpot_b1_ms", ""),
    ("prefill_tflops", ""),
    ("prefill_tflops_ratio", ""),
    ("copy_bandwidth_gbps", ""),
    ("matmul_tflops", ""),
    ("greedy_match_b1_tokens", ""),
]
MOE_HEADLINES = [
    ("moe_tpot_b1_ms", ""),
    ("moe_tpot_b1_ratio", "<= 0.3"),
    ("moe_throughput_b64_ratio", ">= 4"),
    ("moe_bandwidth_utilisation_b1", ">= 0.5"),
    ("checkpoint_write_s", ""),
    ("engine_build_s", ""),
]


def run_tests(out: Path, env: dict[str, str]) -> tuple[bool, list[str]]:
    """Run the GPU tests; (all passed and none skipped, table lines)."""
    xml_path = out / "gpu-tests.xml"
    # NOTE: pytest-benchmark (installed on the GPU image) warns under xdist, and this project
    # turns warnings into errors: the whole session ended INTERNALERROR before any test ran.
    command = [sys.executable, "-m", "pytest", *TEST_PATHS, "-q", "-p", "no:cacheprovider"]
    command += ["-p", "no:benchmark"] if importlib.util.find_spec("pytest_benchmark") else []
    if importlib.util.find_spec("xdist") is not None:  # 8 workers: ~110 s on an H200, not ~5 min
        command += ["-n", "8"]
    subprocess.run([*command, f"--junitxml={xml_path}"], cwd=ROOT, env=env, check=False)
    if not xml_path.exists():
        return False, ["pytest wrote no report"]
    counts: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        module = case.get("classname", "?")  # tests here are module-level functions
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = "failed" if tag in ("failure", "error") else "skipped"
        counts[module][outcome] += 1
        counts[module]["seconds"] += float(case.get("time", 0.0))
    lines = [f"{'test module':<52} {'pass':>5} {'fail':>5} {'skip':>5} {'s':>7}"]
    for module, c in sorted(counts.items()):
        lines.append(
            f"{module:<52} {c['passed']:>5.0f} {c['failed']:>5.0f} {c['skipped']:>5.0f} "
            f"{c['seconds']:>7.1f}"
        )
    bad = sum(c["failed"] + c["skipped"] for c in counts.values())
    return bool(counts) and bad == 0, lines


def run_benchmark(
    out: Path,
    env: dict[str, str],
    bench_args: list[str],
    script: str = "gpu_engine.py",
    headlines: list[tuple[str, str]] = HEADLINES,
) -> tuple[bool, list[str]]:
    """Run ``script`` (a benchmark printing one JSON line last); (it printed, table lines)."""
    command = [sys.executable, str(ROOT / "benchmarks" / script), *bench_args]
    done = subprocess.run(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, check=False
    )
    last = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
    if done.returncode != 0 or not last:
        return False, [f"{script} failed (exit {done.returncode})"]
    result = json.loads(last[0])
    json_path = out / script.replace(".py", ".json")
    json_path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    met = result.get("met", {})
    lines = [f"{script} on {result.get('device')}", f"{'measure':<28} {'value':>12}  target"]
    for key, target in headlines:
        value = result.get(key)
        shown = f"{value:>12.3f}" if isinstance(value, float) else f"{value!s:>12}"
        verdict = "" if key not in met else (" met" if met[key] else " NOT met")
        lines.append(f"{key:<28} {shown}  {target}{verdict}")
    for name, gbps in result.get("staging_gbps", {}).items():
        lines.append(f"{'staging ' + name:<28} {gbps:>12.2f}  GB/s")
    return True, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-check-out")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--moe", action="store_true", help="also run gpu_moe.py (10 GB model)")
    parser.add_argument("bench_args", nargs="*", help="arguments for gpu_engine.py (after --)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu_check.py needs a CUDA GPU: torch.cuda.is_available() is False")
    args.out.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    ok, report = True, list[str]()
    if not args.skip_tests:
        passed, lines = run_tests(args.out, env)
        ok, report = ok and passed, [*report, *lines, ""]
    if not args.skip_bench:
        ran, lines = run_benchmark(args.out, env, args.bench_args)
        ok, report = ok and ran, [*report, *lines]
    if args.moe:
        ran, lines = run_benchmark(args.out, env, [], "gpu_moe.py", MOE_HEADLINES)
        ok, report = ok and ran, [*report, "", *lines]
    print("\n".join(report))
    print("GPU CHECK:", "OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
