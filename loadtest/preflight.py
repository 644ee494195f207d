"""Preflight: will the workload fit the server's context? Checked before anything is sent.

The server's ``max_model_len`` comes from ``/v1/models`` (vLLM and pdserve report it per model)
or, failing that, from ``/tokenize``. Every planned request's prompt (for multi-turn sessions:
the history so far, answers counted at their ``max_tokens``, plus the new text) plus its
``max_tokens`` is compared with it; a workload with any request over the limit stops with one
line naming both numbers and what to change, unless ``--no-preflight``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import httpx

from core.errors import ConfigError, UnavailableError
from loadtest.tokens import TokenCounter
from loadtest.types import Session

LONG_CONTEXT_CONFIG = "configs/local-long-context.yaml"


@dataclass(frozen=True)
class ServedModel:
    """One entry of ``/v1/models``."""

    model_id: str
    max_model_len: int | None


@dataclass(frozen=True)
class RequestSize:
    """Tokens one planned request needs: prompt (as the server counts it) and output budget."""

    session_id: int
    turn_index: int
    prompt_tokens: int
    max_output_tokens: int

    @property
    def total_tokens(self) -> int:
        """Prompt plus output budget: what must fit ``max_model_len``."""
        return self.prompt_tokens + self.max_output_tokens


def list_models(http: httpx.Client, base_url: str, api_key: str | None = None) -> list[ServedModel]:
    """The server's models; UnavailableError when ``/v1/models`` cannot be read."""
    url = base_url.rstrip("/") + "/v1/models"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = http.get(url, headers=headers)
        response.raise_for_status()
        entries = response.json()["data"]
        models = [ServedModel(str(e["id"]), _positive_int(e.get("max_model_len"))) for e in entries]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        raise UnavailableError(f"cannot list models at {url} ({e})") from e
    if not models:
        raise UnavailableError(f"{url} lists no model")
    return models


def pick_model(models: Sequence[ServedModel], wanted: str | None) -> ServedModel:
    """``wanted`` as the server lists it (its limit unknown if unlisted), else the first."""
    if wanted is None:
        return models[0]
    listed = [m for m in models if m.model_id == wanted]
    return listed[0] if listed else ServedModel(wanted, None)


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


def request_sizes(sessions: Sequence[Session], overhead_tokens: int) -> Iterator[RequestSize]:
    """The size of every planned request, turn by turn."""
    for session in sessions:
        history = session.system_tokens
        for index, turn in enumerate(session.turns):
            prompt = history + turn.text_tokens + overhead_tokens
            yield RequestSize(session.session_id, index, prompt, turn.max_output_tokens)
            history += turn.text_tokens + turn.max_output_tokens


def check_fits(
    sessions: Sequence[Session], counter: TokenCounter, model_id: str, max_model_len: int
) -> None:
    """ConfigError (one line) when some planned request cannot fit ``max_model_len``."""
    sizes = list(request_sizes(sessions, counter.overhead_tokens))
    over = [s for s in sizes if s.total_tokens > max_model_len]
    if not over:
        return
    worst = max(over, key=lambda s: s.total_tokens)
    estimated = "" if counter.exact else " (estimated)"
    raise ConfigError(
        f"preflight: the workload's largest request needs {worst.prompt_tokens:,} prompt + "
        f"{worst.max_output_tokens:,} output = {worst.total_tokens:,} tokens{estimated}, but "
        f"{model_id}'s max_model_len is {max_model_len:,} ({len(over)} of {len(sizes)} requests "
        f"do not fit); use a smaller preset or --random-input-len/--random-output-len, or serve "
        f"a long-context config (pdserve up {LONG_CONTEXT_CONFIG}); --no-preflight sends anyway",
        param="max_model_len",
    )
