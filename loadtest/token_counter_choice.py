"""Which ``TokenCounter`` a run uses: the best the user and the server make possible.

1. ``--tokenizer`` (or a ``--model`` that is a local directory or a cached built-in): the
   tokenizer itself (``tokenizer``).
2. Else the server's ``POST /tokenize`` (``server``): exact, whatever the model.
3. Else a few probe requests calibrate words against the server's reported usage
   (``calibrated``).
4. Else one token per word (``approximate``), with a warning.

The summary says which mode ran and its measured error (``counting_report``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import httpx
import numpy as np

from loadtest.calibration import CalibratedCounter, Calibration, calibrate
from loadtest.config import LoadTestConfig
from loadtest.http_client import OpenAIStreamClient
from loadtest.server_tokens import server_counter
from loadtest.tokens import TokenCounter, WordCounter, load_token_counter
from loadtest.types import RequestRecord

logger = logging.getLogger(__name__)

_CALIBRATION_TIMEOUT_S = 120.0


def choose_counter(
    config: LoadTestConfig,
    model: str,
    http: httpx.Client,
    *,
    api_key: str | None = None,
    max_model_len: int | None = None,
) -> TokenCounter:
    """The counter for ``config`` against ``model`` on the target server (see module doc)."""
    target = config.target
    local = load_token_counter(target.tokenizer, target.model)
    if local.exact:
        return local
    chat = target.endpoint.rstrip("/").endswith("chat/completions")
    counter = server_counter(http, target.base_url, model, api_key=api_key, chat=chat)
    if counter is not None:
        return counter
    calibration = asyncio.run(_calibrate(config, model, api_key, max_model_len))
    if calibration is not None:
        return CalibratedCounter(calibration)
    logger.warning(
        "the server neither counts tokens (/tokenize) nor reports usage: prompt lengths are "
        "estimated at one token per word; pass --tokenizer (a tokenizer.json, or the served "
        "GGUF file) for exact lengths"
    )
    return WordCounter()


async def _calibrate(
    config: LoadTestConfig, model: str, api_key: str | None, max_model_len: int | None
) -> Calibration | None:
    target = config.target.model_copy(update={"request_timeout_s": _CALIBRATION_TIMEOUT_S})
    async with httpx.AsyncClient(timeout=_CALIBRATION_TIMEOUT_S) as http:
        client = OpenAIStreamClient(http, target, model, api_key)
        return await calibrate(client, max_model_len=max_model_len)


def counting_report(records: Sequence[RequestRecord], counter: TokenCounter) -> dict[str, Any]:
    """How prompts were counted and how far the plan was from the server's count.

    ``prompt_token_error_pct``: over requests whose server reported ``usage.prompt_tokens``,
    the mean and largest ``|planned - server| / server`` and the mean signed error (percent).
    """
    pairs = [
        (r.expected_prompt_tokens, r.prompt_tokens)
        for r in records
        if r.prompt_token_source == "usage" and r.prompt_tokens > 0
    ]
    report: dict[str, Any] = {
        "token_counts": counter.mode,
        "tokenizer_id": counter.name,
        "prompt_overhead_tokens": counter.overhead_tokens,
    }
    if isinstance(counter, CalibratedCounter):
        report["token_calibration"] = asdict(counter.calibration)
    if pairs:
        errors = np.array([(planned - server) / server for planned, server in pairs]) * 100.0
        report["prompt_token_error_pct"] = {
            "requests": len(pairs),
            "mean_abs": float(np.abs(errors).mean()),
            "max_abs": float(np.abs(errors).max()),
            "mean": float(errors.mean()),
        }
    else:
        report["prompt_token_error_pct"] = None
    return report
