"""API keys: the ``Authorization: Bearer`` check and the per-key prefix-cache salt."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection

from core.errors import AuthenticationError

_BEARER = "bearer "


def authenticate(authorization: str | None, api_keys: Collection[str]) -> None:
    """Accept the request when no keys are configured or it carries one of them.

    Raises :class:`AuthenticationError` for a missing or wrong ``Authorization: Bearer`` key.
    """
    if not api_keys:
        return
    if authorization is None or not authorization.lower().startswith(_BEARER):
        raise AuthenticationError("missing API key: send 'Authorization: Bearer <key>'")
    presented = authorization[len(_BEARER) :].strip().encode()
    # NOTE: compare against every key without short-circuiting, in constant time per key.
    matches = [hmac.compare_digest(presented, key.encode()) for key in api_keys]
    if not any(matches):
        raise AuthenticationError("invalid API key")


def tenant_salt(authorization: str | None) -> str | None:
    """A per-key cache salt: a digest of the bearer key (the key itself never leaves the
    ingress); ``None`` without a bearer key."""
    if authorization is None or not authorization.lower().startswith(_BEARER):
        return None
    key = authorization[len(_BEARER) :].strip().encode()
    return "key:" + hashlib.blake2b(key, digest_size=16, person=b"pdserve-salt").hexdigest()
