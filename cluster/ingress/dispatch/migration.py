"""Request migration: a decode stream that dies mid-request continues on another replica.

When a decode replica dies, drains or stalls while streaming (the stream raises, ends early or
ends with a server-side abort), the ingress re-issues the request to the decode pool as a local
prefill of the prompt *plus every token already sent to the client*, asking only for the tokens
still owed. The new replica prefills that delta (its prefix cache or KV tiers may hold most of
it), and the client's stream continues where it stopped: nothing is repeated, nothing lost, and
under greedy decoding the output is the one a fault-free run gives. A request migrates at most
``routing.migration_limit`` times (Dynamo's knob); errors that are the request's own fault
(a bad prompt, a refused parameter) never migrate.

Text: the new replica renders text only for its own tokens, so bytes the dead replica held back
(part of a multi-byte character, or bytes still to be judged invalid) would be lost. After a
migration the ingress renders the text itself (:class:`ResumedText`): an incremental
detokenizer over the prompt and every token sent and received, emitting whatever lies beyond the
text already sent, so the client's text equals a fault-free run's.

During a rolling upgrade the continuation keeps the request's KV fingerprint: it goes to a
replica of the version it ran on while one serves, else to the new version, which recomputes
prompt and tokens so far under its own weights (identical output when the weights are).

A leaving decode replica may hand a request off instead of letting it break
(:class:`HandedOffError`, from ``TokenChunk.handoff``): it stops the request and exports the
blocks of its prompt and tokens so far, and the continuation carries that export
(``DecodeRequest.warm_from``): the new replica pulls the blocks and computes only the last,
partial one. The pull is refused across KV fingerprints (the blocks are then recomputed), so
only a replica of the same version takes the blocks as they are.

Limits: a seeded sampled request continues with a fresh generator on the new replica (the same
seed, restarted), so its continuation differs from a fault-free run; a stop string that would
have spanned the break is matched only within the new replica's text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol

from core.errors import PdserveError, TransferError, UnavailableError
from core.hashing import hash_prompt_blocks
from core.messages import DecodeRequest, PrefixExport


class HandedOffError(UnavailableError):
    """The decode replica is leaving and stopped the request (``TokenChunk.handoff``): it
    continues elsewhere, pulling ``export`` — the blocks of its prompt and tokens so far —
    when the leaving replica exported any."""

    def __init__(self, message: str, export: PrefixExport | None) -> None:
        super().__init__(message)
        self.export = export


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
    warm_from: PrefixExport | None = None,
) -> DecodeRequest:
    """The request that continues ``original`` after ``generated`` tokens reached the client:
    a local prefill of prompt + generated tokens, for the tokens still owed (pulling
    ``warm_from`` first: the blocks a leaving replica handed off)."""
    prompt = [*original.prompt_token_ids, *generated]
    sampling = original.sampling
    owed = sampling.max_tokens - len(generated)
    sampling = dataclasses.replace(
        sampling, max_tokens=max(owed, 1), min_tokens=max(sampling.min_tokens - len(generated), 0)
    )
    routing = original.routing
    hashes = hash_prompt_blocks(
        prompt, block_size, seed=hash_seed, salt=routing.cache_salt, lora_name=routing.lora_name
    )
    return DecodeRequest(
        request_id=f"{original.request_id}-m{attempt}",
        prompt_token_ids=prompt,
        sampling=sampling,
        # the same fingerprint (a replica of the same version while one serves: its prefix cache
        # is of the same weights; once none does, any: recomputed), the same adapter
        routing=dataclasses.replace(
            routing, block_hashes=tuple(hashes), num_prompt_tokens=len(prompt)
        ),
        warm_from=warm_from,
    )


class TextStream(Protocol):
    """An incremental detokenizer (``engine.tokenizer.IncrementalDetokenizer``)."""

    def step(self, token_ids: Sequence[int]) -> str:
        """Text for these new ids (what is settled so far)."""
        ...

    def finish(self) -> str:
        """Whatever is still held back, at the end."""
        ...


DetokenizerFactory = Callable[[list[int]], TextStream]
"""Prompt ids -> a fresh incremental detokenizer of that request's output."""


class ResumedText:
    """A migrated request's text, rendered at the ingress from every output id: what lies
    beyond the text already sent (never a character twice, none lost at the break)."""

    def __init__(self, stream: TextStream, sent_ids: Sequence[int], text_sent: str) -> None:
        self._stream = stream
        self._text = stream.step(list(sent_ids))
        self._num_sent = len(text_sent)

    def render(self, token_ids: list[int], finished: bool) -> str:
        """The new text for these ids (and the rest on the last chunk)."""
        self._text += self._stream.step(token_ids)
        if finished:
            self._text += self._stream.finish()
        new = self._text[self._num_sent :]
        self._num_sent = max(self._num_sent, len(self._text))
        return new
