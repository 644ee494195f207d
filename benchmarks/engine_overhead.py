"""The engine's own step cost on CPU: a model small enough that a step is host work, not math.

tiny-llama's shape (4 layers, hidden 256, GQA 8:2, MLP 512) with a 32,000-token vocabulary,
written once into a temporary directory by the built-in writer (deterministic random fp32
weights), run by pdserve and by HF ``generate()`` on the same weights, 2 threads, one run: a
decode step here is a few matmuls of 256 wide plus the LM head, so what separates the engines
is what each does around them (scheduling, metadata, uploads, sampling, reading results back).
On a GPU that host work decides batch-1 time per token unless it hides behind the device.

Measures, each ours over HF's (eager and with ``compile_model``), best of ``--repeats``
interleaved rounds after a warm-up: batch-1 TPOT (512-token prompt, 128 new tokens,
``(T(n) - T(1)) / (n - 1)``; targets <= 0.7 both) and batch-8 output tokens/s (targets >= 1.3
eager, >= 1.6 compiled). The last line is one JSON object with the four ratios
(``tpot_b1_ratio_eager``, ``tpot_b1_ratio_compiled``, ``tok_s_b8_ratio_eager``,
``tok_s_b8_ratio_compiled``) and the times behind them.

Usage: ``python benchmarks/engine_overhead.py [--repeats 3] [--threads 2] [--new-tokens 128]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from benchmarks.engine_vs_hf import hf_run, ours_run, paired_best, random_prompts
from engine import LLM
from engine.builtin.specs import BUILTIN_SPECS
from engine.builtin.writer import write_checkpoint

VOCAB = 32_000
TARGETS = {
    "tpot_b1_ratio_eager": ("<=", 0.7),
    "tpot_b1_ratio_compiled": ("<=", 0.7),
    "tok_s_b8_ratio_eager": (">=", 1.3),
    "tok_s_b8_ratio_compiled": (">=", 1.6),
}


def write_model(directory: Path) -> Path:
    """tiny-llama's shape with a 32K vocabulary, written into ``directory``."""
    base = BUILTIN_SPECS["tiny-llama"]
    spec = dataclasses.replace(
        base, name="overhead-llama", config={**base.config, "vocab_size": VOCAB}
    )
    write_checkpoint(spec, directory)
    return directory


def measure(llm: LLM, hf: torch.nn.Module, repeats: int, n: int) -> dict[str, float]:
    """Batch-1 TPOT (ms) and batch-8 output tok/s of ``llm`` and ``hf``, interleaved."""
    one = random_prompts(1, 512, VOCAB, seed=1)
    t = paired_best(
        repeats,
        {
            "hf1": hf_run(hf, one, 1),
            "hfn": hf_run(hf, one, n),
            "us1": ours_run(llm, one, 1),
            "usn": ours_run(llm, one, n),
        },
    )
    eight = random_prompts(8, 512, VOCAB, seed=2)
    t8 = paired_best(repeats, {"hf": hf_run(hf, eight, n), "us": ours_run(llm, eight, n)})
    return {
        "tpot_b1_ms": (t["usn"] - t["us1"]) / (n - 1) * 1e3,
        "hf_tpot_b1_ms": (t["hfn"] - t["hf1"]) / (n - 1) * 1e3,
        "tok_s_b8": 8 * n / t8["us"],
        "hf_tok_s_b8": 8 * n / t8["hf"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    torch.set_num_threads(args.threads)
    result: dict[str, object] = {"benchmark": "engine_overhead", "threads": args.threads}
    with tempfile.TemporaryDirectory(prefix="pdserve-overhead-") as tmp:
        model_dir = write_model(Path(tmp))
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        for mode, compiled in (("eager", False), ("compiled", True)):
            llm = LLM(
                model=str(model_dir),
                dtype="float32",
                max_model_len=1024,
                enable_prefix_caching=False,  # HF has none, and the loops repeat their prompts
                compile_model=compiled,
            )
            figures = measure(llm, hf, args.repeats, args.new_tokens)
            result[mode] = figures
            result[f"tpot_b1_ratio_{mode}"] = figures["tpot_b1_ms"] / figures["hf_tpot_b1_ms"]
            result[f"tok_s_b8_ratio_{mode}"] = figures["tok_s_b8"] / figures["hf_tok_s_b8"]
            del llm
    result["targets"] = {key: f"{op} {value}" for key, (op, value) in TARGETS.items()}
    result["met"] = {
        key: (result[key] <= value if op == "<=" else result[key] >= value)  # type: ignore[operator]
        for key, (op, value) in TARGETS.items()
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
