"""What a client may read of an error: the cause in words and the request id, never internals.

Server-side failures (5xx) carry whatever the failing layer wrote: a Ray traceback with ANSI
colours, PIDs, node addresses and actor ids, a KV transfer id, a file path. :func:`for_client`
turns such an error into one of the same class and status whose message says *what* went wrong
in words and names the request id; the original message goes to the server log under the same
request id, so an operator can find it. Client errors (4xx) keep their message (it names the
field at fault and was written for the client) but pass through :func:`scrub` as a safety net.
"""

from __future__ import annotations

import logging
import re

from core.errors import (
    KVCacheError,
    LayoutMismatchError,
    MessageError,
    PdserveError,
    RequestTimeoutError,
    TransferError,
    UnavailableError,
)

logger = logging.getLogger(__name__)

_CAUSES: tuple[tuple[type[PdserveError], str], ...] = (
    (TransferError, "moving the prompt's KV cache between workers failed"),
    (LayoutMismatchError, "the prefill and decode workers disagree on the KV cache layout"),
    (KVCacheError, "a worker ran out of KV cache memory for this request"),
    (RequestTimeoutError, "the request did not finish within its deadline"),
    (MessageError, "a worker sent a malformed internal message"),
    (UnavailableError, "no worker could serve the request"),
)
_DEFAULT_CAUSE = "the server failed to complete the request"

_SCRUBBERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\x1b\[[0-9;]*[A-Za-z]"), ""),  # ANSI colour codes
    (re.compile(r"Traceback \(most recent call last\):.*", re.DOTALL), "<traceback>"),
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b"), "<address>"),
    (re.compile(r"\[[0-9a-fA-F:]{3,}\](?::\d+)?"), "<address>"),
    (re.compile(r"\b(?:pid|PID)[=: ]+\d+"), "pid=<pid>"),
    (re.compile(r"(?<![\w-])[0-9a-f]{32,}\b"), "<id>"),  # actor, node, task and transfer ids
    (re.compile(r"\bxfer-[\w-]+"), "<transfer>"),
    (re.compile(r"(?<![\w<])/(?:[\w.@+-]+/)+[\w.@+-]*"), "<path>"),
)


def scrub(message: str) -> str:
    """``message`` without ANSI codes, tracebacks, addresses, PIDs, long hex ids and paths."""
    for pattern, replacement in _SCRUBBERS:
        message = pattern.sub(replacement, message)
    return message


def cause_of(error: PdserveError) -> str:
    """The words a client reads for a server-side error of this class."""
    for cls, cause in _CAUSES:
        if isinstance(error, cls):
            return cause
    return _DEFAULT_CAUSE


def for_client(error: PdserveError, request_id: str) -> PdserveError:
    """``error`` as the client may see it (same class, status, param and retry hints)."""
    if error.status_code < 500:
        if error.message == scrub(error.message):
            return error
        return _with_message(error, scrub(error.message))
    logger.warning("request %s failed: %s: %s", request_id, type(error).__name__, error.message)
    return _with_message(error, f"{cause_of(error)} (request id {request_id})")


def _with_message(error: PdserveError, message: str) -> PdserveError:
    public = type(error).__new__(type(error))
    public.__dict__.update(error.__dict__)
    public.message = message
    public.args = (message,)
    return public
