"""Separate views per KV fingerprint: a router only places a request, and only counts a cached
prefix, on replicas whose KV is interchangeable with the request's (``core.kv_compat``).

While a rolling upgrade serves two versions, the index holds both versions' blocks under the
same block hashes (the hash covers tokens and seed, not weights): a prefix cached under the old
weights is no hit for the new. Narrowing the candidates to the request's fingerprint before the
index is matched against them keeps each version's hits to itself, and pairs a request's
prefill and decode. A request of no fingerprint, or one no candidate reports (a stale view: the
replicas of that version just left), is placed among all of them — the transfer handshake still
refuses a pull across fingerprints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

ReplicaT = TypeVar("ReplicaT")


def of_fingerprint(
    candidates: Sequence[ReplicaT], fingerprint: str, fingerprint_of: Callable[[ReplicaT], str]
) -> list[ReplicaT]:
    """The candidates whose fingerprint is ``fingerprint`` (every candidate when it is empty or
    none matches)."""
    if not fingerprint:
        return list(candidates)
    same = [replica for replica in candidates if fingerprint_of(replica) == fingerprint]
    return same or list(candidates)
