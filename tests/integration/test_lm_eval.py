"""lm-evaluation-harness against the live cluster: its OpenAI-compatible completions model
(``local-completions``: token-id prompts, batched, ``echo`` + ``logprobs`` for log-likelihoods,
``stop`` for generate-until) runs two small tasks built here and returns scores, and what it
measured equals the offline engine's prompt log-probabilities and greedy text. lm-eval runs in
its own venv (``lm_eval_probe.py``, started as a subprocess)."""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.sampling import SamplingParams
from engine import LLM
from engine.builtin import resolve_model
from tests.cluster_fixtures import ServingApp
from tests.integration.support import (
    BATCHED_TOKENS,
    EVAL_PYTHON,
    KV_BYTES,
    MAX_MODEL_LEN,
    MODEL,
    SERVED_NAME,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

CHOICE_DOCS = [
    {"question": "[lm-eval 1] The colour of a clear sky at noon is", "choices": ["blue", "green", "red"], "answer": 0},  # noqa: E501
    {"question": "[lm-eval 2] Two plus two equals", "choices": ["four", "five"], "answer": 0},
    {"question": "[lm-eval 3] A prefill pool and a decode pool scale on their own, and the"
                 " KV cache moves between them over", "choices": ["gRPC", "carrier pigeon"], "answer": 0},  # noqa: E501
]  # fmt: skip
GENERATE_DOCS = [
    {"question": "[lm-eval 4] Count: one two three", "answer": " four"},
    {"question": "[lm-eval 5] Days: Monday Tuesday", "answer": " Wednesday"},
    {"question": "[lm-eval 6] Letters: a b c", "answer": " d"},
]
MAX_GEN_TOKS = 6
PROBE = Path(__file__).with_name("lm_eval_probe.py")


def _task_yaml(name: str, data: Path, body: str) -> str:
    return (
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data}\ntest_split: test\ndoc_to_text: '{{{{question}}}}'\n{body}"
    )


def _write_tasks(root: Path) -> None:
    for name, docs in (("pdserve_choice", CHOICE_DOCS), ("pdserve_generate", GENERATE_DOCS)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    choice = (
        "output_type: multiple_choice\ndoc_to_choice: '{{choices}}'\ndoc_to_target: answer\n"
        "metric_list:\n  - metric: acc\n"
    )
    generate = (
        "output_type: generate_until\ndoc_to_target: answer\ngeneration_kwargs:\n"
        f"  until: ['\\n']\n  max_gen_toks: {MAX_GEN_TOKS}\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n"
    )
    for name, body in (("pdserve_choice", choice), ("pdserve_generate", generate)):
        (root / f"{name}.yaml").write_text(_task_yaml(name, root / f"{name}.jsonl", body))


@pytest.fixture(scope="module")
def offline() -> Iterator[LLM]:
    yield LLM(MODEL, dtype="float32", max_model_len=MAX_MODEL_LEN, kv_cache_memory_bytes=KV_BYTES,
              max_num_batched_tokens=BATCHED_TOKENS, max_num_seqs=8)  # fmt: skip


def _offline_loglikelihood(offline: LLM, context: list[int], continuation: list[int]) -> float:
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    out = offline.generate(prompt_token_ids=[context + continuation], sampling_params=params)[0]
    positions = out.prompt_logprobs or []
    tokens = context + continuation
    return sum(positions[i][tokens[i]].logprob for i in range(len(context), len(tokens)))  # type: ignore[index]


def test_lm_eval_local_completions_scores_two_tasks(
    serving_app: ServingApp, offline: LLM, tmp_path: Path
) -> None:
    assert EVAL_PYTHON.exists(), f"{EVAL_PYTHON} is missing: make install-eval creates it"
    _write_tasks(tmp_path)
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "datasets"),
           "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": ""}  # fmt: skip
    args = [str(EVAL_PYTHON), str(PROBE), serving_app.url(""), SERVED_NAME,
            str(resolve_model(MODEL)), str(tmp_path)]  # fmt: skip
    run = subprocess.run(args, check=False, capture_output=True, text=True, env=env, timeout=540)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    scores = report["scores"]
    assert 0.0 <= scores["pdserve_choice"]["acc,none"] <= 1.0
    assert 0.0 <= scores["pdserve_generate"]["exact_match,none"] <= 1.0

    assert len(report["choice"]) == sum(len(doc["choices"]) for doc in CHOICE_DOCS)
    for item in report["choice"]:
        expected = _offline_loglikelihood(offline, item["context_ids"], item["continuation_ids"])
        served = item["loglikelihood"]
        assert math.isclose(served, expected, rel_tol=1e-3, abs_tol=1e-3), (item, expected)

    assert len(report["generate"]) == len(GENERATE_DOCS)
    params = SamplingParams(max_tokens=MAX_GEN_TOKS, temperature=0.0, stop=["\n"])
    for item in report["generate"]:
        reference = offline.generate(prompt_token_ids=[item["prompt_ids"]], sampling_params=params)
        assert item["text"] == reference[0].outputs[0].text, item
