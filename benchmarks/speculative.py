"""Speculative decoding on vs off in one run: TPOT at batch 1, throughput at batch 32,
acceptance length per workload and method, and whether greedy output stayed identical.

Two workloads, ``benchmarks/spec_workloads.py``'s six cases each: ``repetitive`` (answers that
reuse their prompt: repeat a list with one change, edit a piece of code, quote a passage) and
``chat`` (open questions), each a user message through the model's chat template (a model
without one reads the text as it is, and then generates past EOS so every run is as long).
Every method in ``--methods`` runs against the same engine without speculation, all greedy, on
the same model (a random-weight model's answers rarely reuse their prompts, so its acceptance
says little about a trained model's: run ``--model builtin:smollm2-135m-instruct``). A method
this build does not have is reported as unavailable rather than failing the run. The engines
take turns prompt by prompt at batch 1 and batch by batch at batch 32 (``--rounds`` batches
each), so a shared machine whose load changes during the run slows every engine alike.

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
from dataclasses import dataclass, field
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


def _tpot_one(llm: LLM, request_id: str, prompt: str, params: SamplingParams) -> _Timed:
    """One request alone: seconds and output tokens after its first token, and its token ids."""
    engine = llm.engine
    engine.add_request(request_id, _prompt_ids(llm, prompt), params)
    first_s: float | None = None
    num_first = 0
    token_ids: tuple[int, ...] = ()
    while engine.has_unfinished():
        for output in engine.step():
            token_ids = output.outputs[0].token_ids
            if first_s is None and token_ids:
                first_s, num_first = time.perf_counter(), len(token_ids)
    assert first_s is not None
    return _Timed(time.perf_counter() - first_s, len(token_ids) - num_first, [token_ids])


def _throughput(llm: LLM, prompts: Sequence[str], params: SamplingParams) -> _Timed:
    """All ``prompts`` at once: seconds, output tokens and the token ids."""
    token_lists = [_prompt_ids(llm, prompt) for prompt in prompts]
    start = time.perf_counter()
    outputs = llm.generate(prompt_token_ids=token_lists, sampling_params=params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    token_ids = [o.outputs[0].token_ids for o in outputs]
    return _Timed(elapsed, sum(len(t) for t in token_ids), token_ids)


@dataclass
class _Timed:
    """Seconds and tokens summed over measurements, with every output's token ids."""

    seconds: float = 0.0
    num_tokens: int = 0
    token_ids: list[Any] = field(default_factory=list)

    def add(self, other: _Timed) -> None:
        self.seconds += other.seconds
        self.num_tokens += other.num_tokens
        self.token_ids += other.token_ids

    @property
    def per_token_s(self) -> float:
        return self.seconds / max(self.num_tokens, 1)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds


def run(
    model: str, methods: Sequence[str], k: int, max_tokens: int, batch: int, rounds: int = 2
) -> dict[str, Any]:
    """Every measurement, as the JSON object the script prints. Engines with and without
    speculation take turns prompt by prompt (and batch by batch, ``rounds`` times), so a
    machine whose load changes during the run slows every engine alike."""
    engines: dict[str, LLM] = {"off": _llm(model, None)}
    base = engines["off"]
    chat_model = _prompt_ids(base, "x") != list(base.tokenizer.encode("x"))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=not chat_model)
    result: dict[str, Any] = {"benchmark": "speculative", "model": model, "k": k}
    for method in methods:
        try:
            engines[method] = _llm(model, {"method": method, "num_speculative_tokens": k})
        except ConfigError as e:
            result[f"unavailable_{method}"] = e.message
    mixed = [
        WORKLOADS[name][i // 2 % len(WORKLOADS[name])]
        for i in range(batch)
        for name in [WORKLOAD_NAMES[i % 2]]
    ]
    b1 = {(w, name): _Timed() for w in WORKLOADS for name in engines}
    accepted: dict[tuple[str, str], tuple[int, int]] = {}
    for workload, prompts in WORKLOADS.items():
        for i, prompt in enumerate(prompts):
            for name, llm in engines.items():
                before = _spec_stats(llm)
                b1[workload, name].add(_tpot_one(llm, f"b1-{workload}-{i}", prompt, params))
                after = _spec_stats(llm)
                drafts, tokens = accepted.get((workload, name), (0, 0))
                accepted[workload, name] = (
                    drafts + after.num_drafts - before.num_drafts,
                    tokens + after.num_accepted_tokens - before.num_accepted_tokens,
                )
    b32 = {name: _Timed() for name in engines}
    for _ in range(rounds):
        for name, llm in engines.items():
            b32[name].add(_throughput(llm, mixed, params))
    identical = True
    available = [m for m in methods if m in engines]
    for method in available:
        for workload in WORKLOADS:
            drafts, tokens = accepted[workload, method]
            result[f"acceptance_length_{workload}_{method}"] = 1.0 + (
                tokens / drafts if drafts else 0.0
            )
            result[f"spec_tpot_b1_ratio_{workload}_{method}"] = (
                b1[workload, method].per_token_s / b1[workload, "off"].per_token_s
            )
            identical &= b1[workload, method].token_ids == b1[workload, "off"].token_ids
        result[f"spec_throughput_b32_ratio_{method}"] = (
            b32[method].tokens_per_s / b32["off"].tokens_per_s
        )
        identical &= b32[method].token_ids == b32["off"].token_ids
    for llm in engines.values():
        llm.shutdown()
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
    parser.add_argument("--rounds", type=int, default=2, help="batch runs per engine")
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
        args.rounds,
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
