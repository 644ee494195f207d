"""What grammar-constrained decoding and logprobs cost the decode loop.

One engine, one batch of ``--batch`` sequences decoding ``--tokens`` tokens each (EOS ignored so
every run decodes the same count), timed three ways in the same run, alternating ``--repeats``
times: unconstrained; every sequence under a JSON schema (xgrammar's mask filled and applied
per row per step); unconstrained with ``logprobs=5``. The schema asks for long outputs (an array
of 32 to 64 small objects), so the grammar stays live for every step measured. Decode tok/s is
generated tokens over the wall time after the first token of every sequence.

Prints one JSON object last with ``constrained_throughput_ratio`` (constrained / free) and
``logprobs_throughput_ratio`` (logprobs / free).
Usage: ``PYTHONPATH=. .venv/bin/python benchmarks/structured_output.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence

from core.sampling import SamplingParams, StructuredOutput
from engine import LLM

SCHEMA = {
    "type": "array",
    "minItems": 32,
    "maxItems": 64,
    "items": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["id", "ok"],
        "additionalProperties": False,
    },
}


def decode_rate(llm: LLM, batch: int, params: SamplingParams, seed: int) -> float:
    """Generated tokens per second of ``batch`` sequences after their first tokens."""
    engine = llm.engine
    for i in range(batch):
        engine.add_request(f"r{seed}-{i}", [5 + i, 9, 13, 17 + seed % 50], params)
    started: set[str] = set()
    while len(started) < batch:
        started.update(o.request_id for o in engine.step() if o.outputs[0].token_ids)
    tokens, began = 0, time.perf_counter()
    while engine.has_unfinished():
        tokens += len(engine.step())
    return tokens / (time.perf_counter() - began)


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="builtin:tiny-llama")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    llm = LLM(args.model, max_model_len=1024, max_num_seqs=max(args.batch, 8))
    common = {"max_tokens": args.tokens, "ignore_eos": True, "temperature": 0.8, "seed": 1}
    spec = StructuredOutput("json", json.dumps(SCHEMA))
    modes = {
        "free": SamplingParams(**common),
        "constrained": SamplingParams(**common, structured_output=spec),
        "logprobs": SamplingParams(**common, logprobs=5),
    }
    decode_rate(llm, args.batch, modes["constrained"], seed=0)  # warm-up: compile, kernels
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    for repeat in range(args.repeats):
        for mode, params in modes.items():
            rates[mode].append(decode_rate(llm, args.batch, params, seed=repeat + 1))
    median = {mode: statistics.median(values) for mode, values in rates.items()}
    for mode, value in median.items():
        print(
            f"{mode:12s} {value:8.1f} tok/s  (runs: {', '.join(f'{v:.0f}' for v in rates[mode])})"
        )
    print(json.dumps({
        "benchmark": "structured_output",
        "settings": vars(args),
        "decode_tokens_per_s": median,
        "constrained_throughput_ratio": round(median["constrained"] / median["free"], 3),
        "logprobs_throughput_ratio": round(median["logprobs"] / median["free"], 3),
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
