"""Speculative decoding on vs off in one run: TPOT at batch 1, throughput at batch 32,
acceptance length per workload and method, and whether greedy output stayed identical.

Two workloads, ``benchmarks/spec_workloads.py``'s six cases each: ``repetitive`` (answers that
reuse their prompt: repeat a list with one change, edit a piece of code, quote a passage) and
``chat`` (open questions), each a user message through the model's chat template (a model
without one reads the text as it is, and then generates past EOS so every run is as long).
Every method in ``--methods`` runs against the same engine without speculation, all greedy, on
the same model (a random-weight model's answers rarely reuse their prompts, so its acceptance
says little about a trained model's: run ``--model builtin:smollm2-135m-instruct``). A method
this build does not have is reported as unavailable rather than failing the run.

Measured per method: ``spec_tpot_b1_ratio_<workload>_<method>`` (mean time per output token after
the first, one request at a time, speculation on / off), ``spec_throughput_b32_ratio_<method>``
(output tokens/s of 32 requests at once, both workloads mixed, on / off),
``acceptance_length_<workload>_<method>`` (tokens per verify row: 1 + accepted / drafts) and
``greedy_identical`` over everything. The headline keys without a method suffix are the
``--headline`` method's (the first available of ``--methods`` by default).

    PYTHONPATH=. .venv/bin/python benchmarks/speculative.py --model builtin:smollm2-135m-instruct

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from benchmarks.spec_workloads import WORKLOADS as WORKLOAD_NAMES
from benchmarks.spec_workloads import text_cases
from core.errors import ConfigError, InvalidRequestError
from core.sampling import SamplingParams
from core.stats import SpecDecodeStats
from engine import LLM

WORKLOADS: dict[str, list[str]] = {
    workload: [case.prompt for case in text_cases(workload)] for workload in WORKLOAD_NAMES
}
TARGETS = {
    "spec_tpot_b1_ratio_repetitive": ("<=", 0.6),
    "spec_tpot_b1_ratio_chat": ("<=", 1.0),
    "spec_throughput_b32_ratio": (">=", 0.95),
    "greedy_identical": ("==", True),
}


def _llm(model: str, speculative: dict[str, Any] | None) -> LLM:
    """The engine, warmed up on every prompt (first-step costs and prefix caches alike)."""
    llm = LLM(model, max_model_len=1024, speculative_config=speculative)
    prompts = [_prompt_ids(llm, p) for workload in WORKLOADS.values() for p in workload]
    params = SamplingParams(temperature=0.0, max_tokens=8)
    llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    return llm


def _prompt_ids(llm: LLM, text: str) -> list[int]:
    """``text`` as a user message through the model's chat template (a model without one, such
    as the random-weight built-ins, reads the text as it is)."""
    try:
        rendered = llm.tokenizer.apply_chat_template([{"role": "user", "content": text}])
    except InvalidRequestError:
        return list(llm.tokenizer.encode(text))
    return list(llm.tokenizer.encode(rendered, add_special_tokens=False))


def _spec_stats(llm: LLM) -> SpecDecodeStats:
    return llm.engine.scheduler.stats().spec_decode


def _tpot_b1(llm: LLM, prompts: Sequence[str], params: SamplingParams) -> tuple[float, list[Any]]:
    """Mean seconds per output token after the first, one request at a time; the token ids."""
    engine = llm.engine
    total_s, total_tokens = 0.0, 0
    outputs: list[Any] = []
    for i, prompt in enumerate(prompts):
        engine.add_request(f"b1-{id(llm)}-{i}", _prompt_ids(llm, prompt), params)
        first_s: float | None = None
        num_first = 0
        token_ids: tuple[int, ...] = ()
        while engine.has_unfinished():
            for output in engine.step():
                token_ids = output.outputs[0].token_ids
                if first_s is None and token_ids:
                    first_s, num_first = time.perf_counter(), len(token_ids)
        assert first_s is not None
        total_s += time.perf_counter() - first_s
        total_tokens += len(token_ids) - num_first
        outputs.append(token_ids)
    return total_s / max(total_tokens, 1), outputs


def _throughput(
    llm: LLM, prompts: Sequence[str], params: SamplingParams
) -> tuple[float, list[Any]]:
    """Output tokens/s of all ``prompts`` at once; the token ids."""
    token_lists = [_prompt_ids(llm, prompt) for prompt in prompts]
    start = time.perf_counter()
    outputs = llm.generate(prompt_token_ids=token_lists, sampling_params=params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    token_ids = [o.outputs[0].token_ids for o in outputs]
    return sum(len(t) for t in token_ids) / elapsed, token_ids


def _acceptance(before: SpecDecodeStats, after: SpecDecodeStats) -> float:
    drafts = after.num_drafts - before.num_drafts
    accepted = after.num_accepted_tokens - before.num_accepted_tokens
    return 1.0 + (accepted / drafts if drafts else 0.0)


def run(model: str, methods: Sequence[str], k: int, max_tokens: int, batch: int) -> dict[str, Any]:
    """Every measurement, as the JSON object the script prints."""
    base = _llm(model, None)
    chat_model = _prompt_ids(base, "x") != list(base.tokenizer.encode("x"))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=not chat_model)
    result: dict[str, Any] = {"benchmark": "speculative", "model": model, "k": k}
    mixed = [
        WORKLOADS[name][i // 2 % len(WORKLOADS[name])]
        for i in range(batch)
        for name in [WORKLOAD_NAMES[i % 2]]
    ]
    base_b1 = {w: _tpot_b1(base, prompts, params) for w, prompts in WORKLOADS.items()}
    base_tput, base_batch = _throughput(base, mixed, params)
    identical = True
    available: list[str] = []
    for method in methods:
        try:
            spec = _llm(model, {"method": method, "num_speculative_tokens": k})
        except ConfigError as e:
            result[f"unavailable_{method}"] = e.message
            continue
        available.append(method)
        for workload, prompts in WORKLOADS.items():
            before = _spec_stats(spec)
            tpot, token_ids = _tpot_b1(spec, prompts, params)
            result[f"acceptance_length_{workload}_{method}"] = _acceptance(
                before, _spec_stats(spec)
            )
            result[f"spec_tpot_b1_ratio_{workload}_{method}"] = tpot / base_b1[workload][0]
            identical &= token_ids == base_b1[workload][1]
        tput, batch_ids = _throughput(spec, mixed, params)
        result[f"spec_throughput_b32_ratio_{method}"] = tput / base_tput
        identical &= batch_ids == base_batch
        spec.shutdown()
    base.shutdown()
    result["greedy_identical"] = identical
    if available:
        headline = available[0]
        result["headline_method"] = headline
        for workload in WORKLOADS:
            result[f"spec_tpot_b1_ratio_{workload}"] = result[
                f"spec_tpot_b1_ratio_{workload}_{headline}"
            ]
        result["spec_throughput_b32_ratio"] = result[f"spec_throughput_b32_ratio_{headline}"]
    result["targets"] = {key: f"{op} {value}" for key, (op, value) in TARGETS.items()}
    result["met"] = {key: _met(result.get(key), op, value) for key, (op, value) in TARGETS.items()}
    return result


def _met(measured: Any, op: str, target: Any) -> bool | None:
    if measured is None:
        return None
    if op == "<=":
        return bool(measured <= target)
    if op == ">=":
        return bool(measured >= target)
    return bool(measured == target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny-llama")
    parser.add_argument("--methods", default="suffix,ngram", help="comma-separated")
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    torch.set_num_threads(args.threads)
    result = run(
        args.model,
        [m for m in args.methods.split(",") if m],
        args.num_speculative_tokens,
        args.max_tokens,
        args.batch,
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
