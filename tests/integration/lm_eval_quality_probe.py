"""Run by ``.venv-eval/bin/python`` (lm-evaluation-harness's own venv), not collected by pytest:
score pdserve's shipped task ``pdserve_basics`` with lm-eval twice — against a live pdserve
server (``local-completions``: token-id prompts, ``echo`` + ``logprobs``) and with lm-eval's HF
backend on the same GGUF file (transformers' ``from_pretrained(dir, gguf_file=...)``, fp32) —
and print one JSON object with both accuracies and every item's chosen answer.

Usage: ``lm_eval_quality_probe.py BASE_URL MODEL TOKENIZER_DIR GGUF_FILE TASK_DIR [LIMIT]``; run
with the task directory as the working directory (its data file path is relative). ``LIMIT``
scores only the task's first items (the test's; the whole task is the benchmark's figure).
"""

from __future__ import annotations

import concurrent.futures
import json
import sys
from pathlib import Path
from typing import Any

import lm_eval
from lm_eval.models.huggingface import HFLM
from lm_eval.models.openai_completions import LocalCompletionsAPI
from lm_eval.tasks import TaskManager

TASK = "pdserve_basics"


def score(lm: Any, tasks: TaskManager, limit: int | None) -> dict[str, Any]:
    """The task's accuracy and each document's chosen answer index under ``lm`` (its first
    ``limit`` documents; None: all)."""
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=[TASK],
        task_manager=tasks,
        log_samples=True,
        bootstrap_iters=0,
        limit=limit,
    )
    chosen = []
    for sample in sorted(results["samples"][TASK], key=lambda s: s["doc_id"]):
        scores = [float(response[0][0]) for response in sample["resps"]]
        chosen.append(scores.index(max(scores)))
    return {"acc": results["results"][TASK]["acc,none"], "chosen": chosen}


def main(
    base_url: str, model: str, tokenizer_dir: str, gguf_file: str, task_dir: str, limit: str = ""
) -> None:
    served = LocalCompletionsAPI(
        base_url=f"{base_url}/v1/completions",
        model=model,
        tokenizer_backend="huggingface",
        tokenizer=tokenizer_dir,
        tokenized_requests=True,
        batch_size=16,
        max_retries=1,
        timeout=300,
    )
    gguf = Path(gguf_file)
    items = int(limit) if limit else None
    # only the task directory's tasks, indexed once: indexing lm-eval's own thousands of tasks
    # takes ~10 s each time
    tasks = TaskManager(include_path=task_dir, include_defaults=False)
    with concurrent.futures.ThreadPoolExecutor(1) as loader:
        # transformers reads and de-quantizes the GGUF file (~20 s of mostly one core) while
        # the server scores: the two overlap instead of adding up
        loading = loader.submit(HFLM, pretrained=str(gguf.parent), gguf_file=gguf.name,
                                dtype="float32", device="cpu", batch_size=32)  # fmt: skip
        on_server = score(served, tasks, items)
        hf = loading.result()
    print(json.dumps({"served": on_server, "hf": score(hf, tasks, items)}))


if __name__ == "__main__":
    main(*sys.argv[1:7])
