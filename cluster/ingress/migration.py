"""Request migration: a decode stream that dies mid-request continues on another replica.

When a decode replica dies, drains or stalls while streaming (the stream raises, ends early or
ends with a server-side abort), the ingress re-issues the request to the decode pool as a local
prefill of the prompt *plus every token already sent to the client*, asking only for the tokens
still owed. The new replica prefills that delta (its prefix cache or KV tiers may hold most of
it), and the client's stream continues where it stopped: nothing is repeated, nothing lost, and
under greedy decoding the output is the one a fault-free run gives. A request migrates at most
``scheduler.migration_limit`` times (Dynamo's knob); errors that are the request's own fault
(a bad prompt, a refused parameter) never migrate.

Limits: a seeded sampled request continues with a fresh generator on the new replica (the same
seed, restarted), so its continuation differs from a fault-free run; a stop string that would
have spanned the break is matched only within the new replica's text.
"""

from __future__ import annotations

import dataclasses

from core.errors import PdserveError, TransferError, UnavailableError
from core.hashing import hash_prompt_blocks
from core.messages import DecodeRequest, RoutingKeys


def can_migrate(error: BaseException) -> bool:
    """True for failures of the decode replica or of its KV pull (a healthy replica can go on
    with a local prefill) rather than of the request itself."""
    if isinstance(error, TimeoutError):
        return True
    return isinstance(error, PdserveError) and isinstance(error, UnavailableError | TransferError)


def migrated_request(
    original: DecodeRequest,
    generated: list[int],
    attempt: int,
    *,
    block_size: int,
    hash_seed: int,
) -> DecodeRequest:
    """The request that continues ``original`` after ``generated`` tokens reached the client:
    a local prefill of prompt + generated tokens, for the tokens still owed."""
    prompt = [*original.prompt_token_ids, *generated]
    sampling = original.sampling
    owed = sampling.max_tokens - len(generated)
    sampling = dataclasses.replace(
        sampling, max_tokens=max(owed, 1), min_tokens=max(sampling.min_tokens - len(generated), 0)
    )
    routing = original.routing
    hashes = hash_prompt_blocks(prompt, block_size, seed=hash_seed, salt=routing.cache_salt)
    return DecodeRequest(
        request_id=f"{original.request_id}-m{attempt}",
        prompt_token_ids=prompt,
        sampling=sampling,
        routing=RoutingKeys(tuple(hashes), len(prompt), routing.session_id, routing.cache_salt),
    )
