"""The real model (``builtin:smollm2-135m-instruct``, SmolLM2-135M-Instruct Q4_1 GGUF) on pdserve
against HF transformers ``generate()`` loading the same GGUF file, fp32 on the CPU, one run.

Prints progress lines, then one JSON line last:

- ``real_tpot_b1_ratio``: batch-1 time per output token, pdserve / HF (target <= 0.9);
- ``real_tok_s_b8_ratio``: batch-8 output tokens/s, pdserve / HF (target >= 1.25);
- ``gguf_load_s`` / ``hf_gguf_load_s``: building ``LLM(model=...)`` (weights dequantized from the
  GGUF, tokenizer, KV cache) against transformers' model + tokenizer ``from_pretrained`` of the
  file; ``gguf_first_resolve_s``: writing the file's metadata directory (once per file);
- ``served_ttft_ms_p50`` / ``served_tpot_ms_p50``: ``pdserve bench`` (chat prompts' length, 64
  output tokens, concurrency 4) against ``configs/local.yaml`` — what ``make serve`` runs —
  started here with ``pdserve up --detach`` on free ports and stopped after (``--base-url``
  measures a server already running instead; ``--no-serve`` skips this part).

Prompts are the chat-templated questions below; each side generates exactly ``--new-tokens``
tokens (EOS ignored). Time per output token is ``(T(n) - T(1)) / (n - 1)``, so prefill cancels;
each time is the best of ``--repeats`` rounds interleaving HF's runs and pdserve's. Prefix
caching is off for the timed comparisons (HF has none and the rounds repeat their prompts).
pdserve runs eager, as ``configs/local.yaml`` does; ``--compile`` turns ``compile_model`` on (its
compilation, about two minutes here, happens while the engine is built, outside the timings).
Usage: ``python benchmarks/real_model.py [--threads 2] [--repeats 3] [--new-tokens 64]
[--compile]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

from benchmarks.engine_vs_hf import paired_best
from engine import LLM, SamplingParams
from engine.builtin.packaged import PACKAGED_MODELS, packaged_file
from engine.builtin.resolve import ensure_gguf_dir

NAME = "smollm2-135m-instruct"
MODEL = f"builtin:{NAME}"
REPO = Path(__file__).resolve().parents[1]
QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "Who wrote Romeo and Juliet?",
    "Explain what a noun is in one sentence.",
    "Which planet is closest to the sun?",
    "Translate 'thank you' into Spanish.",
    "Why do we need sleep?",
]


def hf_generate(model: Any, prompts: list[list[int]], n: int, pad: int) -> Any:
    """HF ``generate()`` of exactly ``n`` greedy tokens for the left-padded batch."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

    def go() -> object:
        with torch.inference_mode():
            return model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False, pad_token_id=pad)  # fmt: skip

    return go


def ours_generate(llm: LLM, prompts: list[list[int]], n: int) -> Any:
    """pdserve's ``LLM.generate()`` of exactly ``n`` greedy tokens for the batch."""
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return lambda: llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)


def load_times(gguf: Path, compiled: bool) -> tuple[LLM, Any, Any, dict[str, float]]:
    """Both sides loaded from the GGUF file, timed (the metadata directory written first, into
    a temporary cache, timed apart)."""
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        ensure_gguf_dir(gguf, Path(cache) / NAME)
        first_resolve = time.perf_counter() - start
    start = time.perf_counter()
    llm = LLM(MODEL, dtype="float32", max_model_len=1024, enable_prefix_caching=False)
    ours = time.perf_counter() - start
    if compiled:  # the load is timed without the compilation
        llm = LLM(MODEL, dtype="float32", max_model_len=1024, enable_prefix_caching=False,
                  compile_model=True)  # fmt: skip
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32).eval()  # fmt: skip
    theirs = time.perf_counter() - start
    times = {"gguf_load_s": ours, "hf_gguf_load_s": theirs, "gguf_first_resolve_s": first_resolve}
    return llm, model, tokenizer, times


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pdserve(*args: str, env: dict[str, str], timeout_s: float = 900) -> str:
    """Run the ``pdserve`` CLI; its stdout (raises with its stderr on failure)."""
    done = subprocess.run([sys.executable, "-m", "cluster.ops.cli", *args], env=env, text=True,
                          capture_output=True, timeout=timeout_s, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"pdserve {args[0]} failed: {done.stderr[-2000:]}")
    return done.stdout


def bench(base_url: str, env: dict[str, str], workdir: Path, prompt_len: int, n: int) -> dict:
    """``pdserve bench`` against ``base_url``: its result JSON."""
    pdserve("bench", "--base-url", base_url, "--backend", "openai", "--dataset-name", "random",
            "--random-input-len", str(prompt_len), "--random-output-len", str(n),
            "--num-prompts", "32", "--max-concurrency", "4", "--ignore-eos",
            "--tokenizer", MODEL, "--save-result", "--result-dir", str(workdir),
            "--result-filename", "real.json", "--no-progress", "--no-plots", env=env)  # fmt: skip
    result: dict = json.loads((workdir / "real.json").read_text())
    return result


def served(base_url: str | None, prompt_len: int, n: int) -> dict[str, float]:
    """TTFT and TPOT medians of ``pdserve bench`` against ``make serve``'s configuration."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        if base_url is None:
            config = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
            config["server"]["port"] = free_port()
            config["cluster"]["dashboard_port"] = free_port()
            path = workdir / "local.yaml"
            path.write_text(yaml.safe_dump(config))
            env["PDSERVE_CACHE_DIR"] = str(workdir / "cache")  # its own run state
            print("starting pdserve up --detach configs/local.yaml", file=sys.stderr)
            pdserve("up", str(path), "--detach", env=env)
            base_url = f"http://127.0.0.1:{config['server']['port']}"
            try:
                result = bench(base_url, env, workdir, prompt_len, n)
            finally:
                pdserve("down", env=env)
        else:
            result = bench(base_url, env, workdir, prompt_len, n)
    return {"served_ttft_ms_p50": result["median_ttft_ms"],
            "served_tpot_ms_p50": result["median_tpot_ms"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--base-url", help="measure this running server instead of starting one")
    parser.add_argument("--no-serve", action="store_true", help="skip the served part")
    parser.add_argument("--compile", action="store_true", help="pdserve with compile_model on")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n = args.new_tokens
    gguf = packaged_file(PACKAGED_MODELS[NAME])
    llm, hf, tokenizer, times = load_times(gguf, args.compile)
    result: dict[str, Any] = dict(times)
    pad = tokenizer.pad_token_id
    prompts = [
        llm.tokenizer.encode(llm.tokenizer.apply_chat_template([{"role": "user", "content": q}]),
                             add_special_tokens=False)
        for q in QUESTIONS
    ]  # fmt: skip
    print(f"loaded: {json.dumps(result)}", file=sys.stderr)

    one = prompts[:1]
    t = paired_best(args.repeats, {
        "hf1": hf_generate(hf, one, 1, pad), "hfn": hf_generate(hf, one, n, pad),
        "us1": ours_generate(llm, one, 1), "usn": ours_generate(llm, one, n),
    })  # fmt: skip
    hf_tpot, us_tpot = (t["hfn"] - t["hf1"]) / (n - 1), (t["usn"] - t["us1"]) / (n - 1)
    print(f"batch 1 TPOT: pdserve {us_tpot * 1e3:.1f} ms, HF {hf_tpot * 1e3:.1f} ms",
          file=sys.stderr)  # fmt: skip

    t = paired_best(args.repeats, {"hf": hf_generate(hf, prompts, n, pad),
                                   "us": ours_generate(llm, prompts, n)})  # fmt: skip
    hf_tps, us_tps = len(prompts) * n / t["hf"], len(prompts) * n / t["us"]
    print(f"batch 8 tok/s: pdserve {us_tps:.1f}, HF {hf_tps:.1f}", file=sys.stderr)
    result.update(
        model=MODEL,
        threads=args.threads,
        compile_model=args.compile,
        real_tpot_b1_ms=us_tpot * 1e3,
        hf_tpot_b1_ms=hf_tpot * 1e3,
        real_tpot_b1_ratio=us_tpot / hf_tpot,
        real_tok_s_b8=us_tps,
        hf_tok_s_b8=hf_tps,
        real_tok_s_b8_ratio=us_tps / hf_tps,
    )
    del llm, hf
    if not args.no_serve:
        prompt_len = round(sum(map(len, prompts)) / len(prompts))
        result.update(served(args.base_url, prompt_len, n))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
