"""lm-evaluation-harness against the live cluster: its OpenAI-compatible completions model
(``local-completions``: token-id prompts, batched, ``echo`` + ``logprobs`` for log-likelihoods,
``stop`` for generate-until) runs two small tasks built here and returns scores, and what it
measured equals the offline engine's prompt log-probabilities and greedy text."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from core.sampling import SamplingParams
from engine import LLM
from engine.builtin import resolve_model
from tests.integration.conftest import ServingApp
from tests.integration.support import BATCHED_TOKENS, KV_BYTES, MAX_MODEL_LEN, MODEL, SERVED_NAME

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
    serving_app: ServingApp, offline: LLM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import lm_eval
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    _write_tasks(tmp_path)
    lm = LocalCompletionsAPI(
        base_url=serving_app.url("/v1/completions"),
        model=SERVED_NAME,
        tokenizer_backend="huggingface",
        tokenizer=str(resolve_model(MODEL)),
        tokenized_requests=True,
        batch_size=4,
        max_length=MAX_MODEL_LEN,
        max_retries=1,
        timeout=120,
    )
    results: dict[str, Any] = lm_eval.simple_evaluate(
        model=lm,
        tasks=["pdserve_choice", "pdserve_generate"],
        task_manager=TaskManager(include_path=str(tmp_path)),
        log_samples=True,
        bootstrap_iters=0,
    )
    scores = results["results"]
    assert 0.0 <= scores["pdserve_choice"]["acc,none"] <= 1.0
    assert 0.0 <= scores["pdserve_generate"]["exact_match,none"] <= 1.0

    choice_samples = results["samples"]["pdserve_choice"]
    assert len(choice_samples) == len(CHOICE_DOCS)
    for sample in choice_samples:
        doc = sample["doc"]
        for arguments, response in zip(sample["arguments"], sample["resps"], strict=True):
            context, continuation = arguments[0], arguments[1]
            context_ids, continuation_ids = lm._encode_pair(context, continuation)
            expected = _offline_loglikelihood(offline, context_ids, continuation_ids)
            served = float(response[0][0])
            assert math.isclose(served, expected, rel_tol=1e-3, abs_tol=1e-3), (doc, served)

    generate_samples = results["samples"]["pdserve_generate"]
    assert len(generate_samples) == len(GENERATE_DOCS)
    params = SamplingParams(max_tokens=MAX_GEN_TOKS, temperature=0.0, stop=["\n"])
    for sample in generate_samples:
        context = sample["arguments"][0][0]
        prompt_ids = lm.tok_encode(context)
        reference = offline.generate(prompt_token_ids=[prompt_ids], sampling_params=params)[0]
        assert sample["resps"][0][0] == reference.outputs[0].text, sample["doc"]
