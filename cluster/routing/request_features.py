"""What a router reads from a request: the :class:`~core.messages.RoutingKeys` it carries.

The ingress calls the Prefill/Decode handles with one message — a ``PrefillRequest`` or a
``DecodeRequest`` as plain data (``core.codec``) — as the **first positional argument** (or as the
keyword ``request``). Its ``routing`` field holds the keys the ingress computed once: the
prompt's chained block hashes (the engines' own function and seed), its length and the session
id. The router decodes that field alone with the same codec. Without a session id in the keys,
Serve's ``handle.options(session_id=...)`` value is used; a call that carries no message (or a
malformed one) routes as a request without a cached prefix.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from core.codec import from_plain
from core.errors import MessageError
from core.messages import RoutingKeys

logger = logging.getLogger(__name__)


def request_payload(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The plain message: the first positional argument, else the ``request`` keyword."""
    if args and isinstance(args[0], Mapping):
        return args[0]
    payload = kwargs.get("request")
    return payload if isinstance(payload, Mapping) else None


def read_routing_keys(
    args: Sequence[Any], kwargs: Mapping[str, Any], *, fallback_session_id: str | None = None
) -> RoutingKeys:
    """The request's ``routing`` field, decoded (see the module docstring)."""
    fallback = fallback_session_id or None
    payload = request_payload(args, kwargs)
    if payload is None or "routing" not in payload:
        return RoutingKeys(session_id=fallback)
    try:
        keys = from_plain(RoutingKeys, payload["routing"])
    except MessageError as e:
        logger.warning("request %s: unreadable routing keys: %s", payload.get("request_id"), e)
        return RoutingKeys(session_id=fallback)
    if keys.session_id is None and fallback is not None:
        return dataclasses.replace(keys, session_id=fallback)
    return keys
