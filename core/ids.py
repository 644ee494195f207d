"""Identifiers: request ids and transfer ids, random and printable."""

from __future__ import annotations

import secrets


def new_request_id(prefix: str = "req") -> str:
    """A fresh request id such as ``req-3f9c2a...`` (96 random bits)."""
    return f"{prefix}-{secrets.token_hex(12)}"


def new_transfer_id() -> str:
    """A fresh, unguessable transfer id (128 random bits)."""
    return f"xfer-{secrets.token_hex(16)}"
