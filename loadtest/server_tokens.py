"""Exact token counts from the server itself: ``POST /tokenize`` (pdserve's and vLLM's).

The request is vLLM's: ``{"model", "prompt", "add_special_tokens"}`` or ``{"model",
"messages"}``; the answer carries ``count`` (and ``max_model_len``). Text is counted without
special tokens (so counts add up unit by unit, which prompt synthesis relies on); the tokens the
server adds around a prompt are measured once, as the difference a one-character prompt shows
with and without them (completions) or inside a one-message chat (chat completions).
Counts are cached: prompt synthesis asks for the same short units again and again.
"""

from __future__ import annotations

from typing import Any

import httpx

from core.errors import UnavailableError
from loadtest.http_client import http_error_message

_PROBE_TEXT = "x"


class ServerTokenCounter:
    """A ``TokenCounter`` that asks the server under test (sync HTTP, one call per new text)."""

    exact = True
    mode = "server"
    tokens_per_count = 1.0

    def __init__(
        self,
        http: httpx.Client,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        chat: bool = False,
    ) -> None:
        self._http = http
        self._url = base_url.rstrip("/") + "/tokenize"
        self._model = model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._cache: dict[str, int] = {}
        self.name = self._url
        self.max_model_len: int | None = None
        bare = self.count(_PROBE_TEXT)
        if chat:
            messages = [{"role": "user", "content": _PROBE_TEXT}]
            wrapped = self._post({"model": model, "messages": messages})
        else:
            wrapped = self._post({"model": model, "prompt": _PROBE_TEXT})
        self.overhead_tokens = max(0, wrapped - bare)

    def count(self, text: str) -> int:
        """Tokens of ``text`` without special tokens, as the server's tokenizer counts them."""
        cached = self._cache.get(text)
        if cached is None:
            body = {"model": self._model, "prompt": text, "add_special_tokens": False}
            cached = self._cache[text] = self._post(body)
        return cached

    def _post(self, body: dict[str, Any]) -> int:
        try:
            response = self._http.post(self._url, json=body, headers=self._headers)
        except httpx.HTTPError as e:
            raise UnavailableError(f"POST {self._url} failed: {type(e).__name__}: {e}") from e
        if response.status_code != 200:
            message = http_error_message(response, response.content)
            raise UnavailableError(f"POST {self._url} answered {response.status_code}: {message}")
        try:
            payload = response.json()
            count = int(payload["count"])
        except (ValueError, KeyError, TypeError) as e:
            raise UnavailableError(f"POST {self._url}: not a tokenize answer ({e})") from e
        limit = payload.get("max_model_len")
        if isinstance(limit, int) and self.max_model_len is None:
            self.max_model_len = limit
        return count


def server_counter(
    http: httpx.Client,
    base_url: str,
    model: str,
    *,
    api_key: str | None = None,
    chat: bool = False,
) -> ServerTokenCounter | None:
    """The server's counter, or None when the server does not count for this model (no answer,
    or any answer but 200 to a probe, except 401: the API key is wrong or missing)."""
    url = base_url.rstrip("/") + "/tokenize"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        probe = http.post(url, json={"model": model, "prompt": _PROBE_TEXT}, headers=headers)
    except httpx.HTTPError:
        return None  # the run reports the server's state request by request
    if probe.status_code == 401:
        raise UnavailableError(f"{url} answered 401: pass the server's key with --api-key")
    if probe.status_code != 200 or "count" not in _json_object(probe):
        return None
    return ServerTokenCounter(http, base_url, model, api_key=api_key, chat=chat)


def _json_object(response: httpx.Response) -> dict[str, Any]:
    try:
        payload = response.json()
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}
