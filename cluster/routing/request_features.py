"""What a router reads from a request: block hashes, prompt length, session id.

The ingress calls the Prefill/Decode handles with the request dict (``PrefillRequest.to_dict()``
or ``DecodeRequest.to_dict()``) as the **first positional argument** (or as the keyword
``request``) and adds two keys to it:

* ``block_hashes`` — ``core.hashing.hash_prompt_blocks(prompt_token_ids, block_size,
  seed=layout.hash_seed)``, the same chained hashes the engines' prefix caches use;
* ``session_id`` — from ``sessions.extract_session_id`` (``x-session-id`` header or ``user``).

``prompt_token_ids`` gives the prompt length; if ``block_hashes`` is missing and the router was
configured with a ``block_size``, the hashes are computed from it (slower, same result). Without
a ``session_id`` key, Serve's ``handle.options(session_id=...)`` value is used. Anything else
(no dict, unresolved arguments) routes as a request without a cached prefix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.hashing import BlockHash, hash_prompt_blocks

BLOCK_HASHES_KEY = "block_hashes"
SESSION_ID_KEY = "session_id"
PROMPT_TOKENS_KEY = "prompt_token_ids"


@dataclass(frozen=True)
class RequestFeatures:
    """The routing-relevant facts of one request."""

    block_hashes: tuple[BlockHash, ...] = ()
    num_prompt_tokens: int = 0
    session_id: str | None = None


def request_payload(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The request dict: the first positional argument, else the ``request`` keyword."""
    if args and isinstance(args[0], Mapping):
        return args[0]
    payload = kwargs.get("request")
    return payload if isinstance(payload, Mapping) else None


def read_features(
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    fallback_session_id: str | None = None,
    block_size: int | None = None,
    hash_seed: int = 0,
) -> RequestFeatures:
    """Extract :class:`RequestFeatures` as described in the module docstring."""
    payload = request_payload(args, kwargs)
    if payload is None:
        return RequestFeatures(session_id=fallback_session_id or None)
    prompt = payload.get(PROMPT_TOKENS_KEY)
    prompt_ids: Sequence[int] = ()
    if isinstance(prompt, Sequence) and not isinstance(prompt, str | bytes):
        prompt_ids = prompt
    hashes = _hashes(payload.get(BLOCK_HASHES_KEY))
    if hashes is None and block_size and prompt_ids:
        hashes = tuple(hash_prompt_blocks(prompt_ids, block_size, seed=hash_seed))
    hashes = hashes or ()
    session = payload.get(SESSION_ID_KEY)
    session_id = session if isinstance(session, str) and session else fallback_session_id
    num_tokens = len(prompt_ids) or len(hashes) * (block_size or 0)
    return RequestFeatures(hashes, num_tokens, session_id or None)


def _hashes(raw: Any) -> tuple[BlockHash, ...] | None:
    """``raw`` as a tuple of ints; ``None`` when absent or malformed (never raises)."""
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes):
        return None
    if not all(isinstance(h, int) and not isinstance(h, bool) for h in raw):
        return None
    return tuple(raw)
