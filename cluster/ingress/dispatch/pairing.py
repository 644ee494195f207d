"""Pairing by KV fingerprint: which version of the model a request runs under.

While a rolling upgrade serves two versions (``core.kv_compat``: another checkpoint, block-hash
seed, ...), a request's prefill and decode must run on replicas of one fingerprint, or the
decode would be handed KV it cannot read. Before a request starts the ingress picks the
fingerprint of its decode — at random, weighted by the live decode replicas of each, so the
traffic follows the rollout — and names it in the request's routing keys (the routers place it
only on replicas of that fingerprint). When no live prefill replica shares it, the request
prefills locally on its decode (the existing fallback): never a pull across versions.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from cluster.ingress.dispatch.prepared_prompt import PreparedPrompt
from core.kv_handle import KVHandle


class FleetVersions(Protocol):
    """The live replicas of one model's pools by KV fingerprint (cheap, never blocks)."""

    def decode_fingerprints(self) -> Mapping[str, int]:
        """Fingerprint -> live decode replicas ("" for replicas that declare none)."""
        ...

    def prefill_fingerprints(self) -> Mapping[str, int]:
        """Fingerprint -> live prefill replicas ("" for replicas that declare none)."""
        ...


@dataclass(frozen=True)
class Pairing:
    """The fingerprint one request runs under, and whether a prefill replica has it."""

    kv_fingerprint: str
    has_prefill: bool


def choose_pairing(versions: FleetVersions, rng: random.Random) -> Pairing | None:
    """The request's pairing; None when the decode pool declares no fingerprint (any pair)."""
    decode = {fp: n for fp, n in versions.decode_fingerprints().items() if fp and n > 0}
    if not decode:
        return None
    fingerprints = sorted(decode)
    if len(fingerprints) == 1:
        chosen = fingerprints[0]
    else:
        chosen = rng.choices(fingerprints, weights=[decode[fp] for fp in fingerprints])[0]
    return Pairing(chosen, versions.prefill_fingerprints().get(chosen, 0) > 0)


def paired(prompt: PreparedPrompt, pairing: Pairing | None) -> PreparedPrompt:
    """``prompt`` with its routing keys naming ``pairing``'s fingerprint."""
    if pairing is None:
        return prompt
    return replace(prompt, routing=replace(prompt.routing, kv_fingerprint=pairing.kv_fingerprint))


def handle_fingerprint(handle: KVHandle | None, default: str) -> str:
    """The fingerprint a decode of ``handle`` must have: the exporter's own, when it declared
    one (the truth, whatever the view said), else ``default``."""
    if handle is None or handle.kv_compat is None:
        return default
    return handle.kv_compat.fingerprint()
