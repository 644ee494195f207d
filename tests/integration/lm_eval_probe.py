"""Run by ``.venv-eval/bin/python`` (lm-evaluation-harness's own venv), not collected by pytest:
score two small tasks with lm-eval's ``local-completions`` model against a live server, and
print one JSON object with the scores plus what each item sent and measured (token ids, the
log-likelihood or the generated text), for the test to check against the offline engine.

Usage: ``lm_eval_probe.py BASE_URL MODEL TOKENIZER_DIR TASK_DIR``.
"""

from __future__ import annotations

import json
import sys

import lm_eval
from lm_eval.models.openai_completions import LocalCompletionsAPI
from lm_eval.tasks import TaskManager


def main(base_url: str, model: str, tokenizer_dir: str, task_dir: str) -> None:
    lm = LocalCompletionsAPI(
        base_url=f"{base_url}/v1/completions",
        model=model,
        tokenizer_backend="huggingface",
        tokenizer=tokenizer_dir,
        tokenized_requests=True,
        batch_size=4,
        max_retries=1,
        timeout=120,
    )
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=["pdserve_choice", "pdserve_generate"],
        # only the tasks in task_dir: indexing lm-eval's own thousands of tasks takes ~10 s
        task_manager=TaskManager(include_path=task_dir, include_defaults=False),
        log_samples=True,
        bootstrap_iters=0,
    )
    choice = []
    for sample in results["samples"]["pdserve_choice"]:
        for arguments, response in zip(sample["arguments"], sample["resps"], strict=True):
            context_ids, continuation_ids = lm._encode_pair(arguments[0], arguments[1])
            choice.append({"context_ids": context_ids, "continuation_ids": continuation_ids,
                           "loglikelihood": float(response[0][0])})  # fmt: skip
    generate = [
        {"prompt_ids": lm.tok_encode(sample["arguments"][0][0]), "text": sample["resps"][0][0]}
        for sample in results["samples"]["pdserve_generate"]
    ]
    scores = {task: dict(values) for task, values in results["results"].items()}
    print(json.dumps({"scores": scores, "choice": choice, "generate": generate}, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:5])
