"""Control messages between the ingress, the request routers and the prefill / decode roles.

Frozen dataclasses of typed fields — never tensors, never ``dict[str, Any]``. They cross Ray
Serve as plain data through the one codec (``core.codec.to_plain`` / ``from_plain``), so a handle
call carries only JSON-shaped values and a peer of another version fails loudly.

Both request types carry the :class:`RoutingKeys` the ingress computed once (the prompt's chained
block hashes and the session id); the pools' request routers read ``request.routing`` and the
workers never recompute them. Both roles report a failure as one :class:`~core.errors.
ErrorReport`: inside a :class:`PrefillReply`, or on the last :class:`TokenChunk` of a stream.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

from core.errors import ErrorReport, MessageError
from core.hashing import BlockHash
from core.kv_handle import KVHandle
from core.sampling import SamplingParams


@dataclass(frozen=True)
class RoutingKeys:
    """What a request router needs to place a request, computed once by the ingress."""

    block_hashes: tuple[BlockHash, ...] = ()
    """Chained hashes of the prompt's full blocks (``core.hashing``, the engines' own seed)."""
    num_prompt_tokens: int = 0
    """Prompt length in tokens (routers weigh uncached work by it)."""
    session_id: str | None = None
    """``x-session-id`` header or the body's ``user``; sticks a conversation to a replica."""
    cache_salt: str | None = None
    """The request's cache salt (its ``cache_salt`` and/or its API key's tenant salt): it
    entered ``block_hashes`` and the engines hash the prompt with it too."""
    _: KW_ONLY  # the fields below are named wherever they are given
    kv_fingerprint: str = ""
    """The KV fingerprint (``core.kv_compat``) the request runs under: routers send it only to
    replicas of this fingerprint while any is there, so its prefill and decode pair up (a
    rolling upgrade serves two); empty: any replica."""
    replica_id: str | None = None
    """This replica and no other (a hot-prefix copy's call to its holder or its target); None:
    the router chooses."""
    lora_name: str | None = None
    """The LoRA adapter the request runs under (None: the base model). Both roles run it under
    this adapter; it entered ``block_hashes`` (as it enters the engines' hashes) and routers
    weigh where it is resident."""


@dataclass(frozen=True)
class LogprobEntry:
    """A token, its text and its log-probability."""

    token_id: int
    token: str
    logprob: float


@dataclass(frozen=True)
class TokenLogprobs:
    """One position's log-probabilities: the token there and the top-n alternatives (best
    first; ``SamplingParams.logprobs`` or ``prompt_logprobs`` of them)."""

    chosen: LogprobEntry
    top: tuple[LogprobEntry, ...] = ()


@dataclass(frozen=True)
class StageTimes:
    """Where one request's time went on a worker before its first token(s), in seconds.

    A prefill (remote, or local on decode) reports ``queue_s`` (waiting for the first batch)
    and ``prefill_s`` (first batch to first sampled token); a remote prefill adds ``export_s``
    (pinning and exporting its KV before it answers). A decode that imports KV reports
    ``transfer_s`` (reserving blocks and pulling them) and ``first_decode_s`` (KV in place to
    its first token). The ingress assembles them into the request's TTFT breakdown.
    """

    queue_s: float = 0.0
    prefill_s: float = 0.0
    export_s: float = 0.0
    transfer_s: float = 0.0
    first_decode_s: float = 0.0


@dataclass(frozen=True)
class PrefillRequest:
    """Ingress -> prefill: compute the prompt's KV, sample the first token, export the KV."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    routing: RoutingKeys = RoutingKeys()


@dataclass(frozen=True)
class PrefillResult:
    """Prefill -> ingress: the first token (and its text) plus where to pull the KV from.

    ``kv_handle`` is None when the first token already ended the request (``finish_reason``
    set) — nothing to decode, nothing pinned.
    """

    request_id: str
    first_token_id: int
    first_text: str
    num_cached_tokens: int
    kv_handle: KVHandle | None
    finish_reason: str | None = None
    prompt_chunk_ends: tuple[int, ...] = ()
    """Where the prefill's prompt chunks ended (a prefix-cache hit's end included), so a decode
    that must recompute the prompt chunks it the same way (same output)."""
    first_logprobs: TokenLogprobs | None = None
    """The first token's, when the request asked for ``logprobs``."""
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = ()
    """Each prompt token's (None for the first), when it asked for ``prompt_logprobs``."""
    stage_times: StageTimes = StageTimes()
    """Queue, prefill and export time on the prefill replica."""


@dataclass(frozen=True)
class PrefillStarted:
    """Prefill -> ingress, first on a pipelined prefill: the export the decode can pull from at
    once (``kv_handle.pipelined``), while the prompt is still being computed. The
    :class:`PrefillReply` follows once the first token is sampled."""

    request_id: str
    kv_handle: KVHandle


@dataclass(frozen=True)
class PrefillReply:
    """What a prefill replica answers: exactly one of ``result`` and ``error``."""

    result: PrefillResult | None = None
    error: ErrorReport | None = None

    def unwrap(self) -> PrefillResult:
        """The result, or the reported error raised as its own ``core.errors`` class."""
        if self.error is not None:
            raise self.error.to_error()
        if self.result is None:
            raise MessageError("a PrefillReply holds neither a result nor an error")
        return self.result


PrefillUpdate = PrefillStarted | PrefillReply
"""What a pipelined prefill streams: a :class:`PrefillStarted`, then its :class:`PrefillReply`
(just the reply when it fails before the export opened)."""


@dataclass(frozen=True)
class DecodeRequest:
    """Ingress -> decode: continue after ``first_token_id`` with KV pulled from ``kv_handle``.

    Both None means *local prefill*: decode runs the whole request itself (short prompts,
    no healthy prefill capacity) and streams from the first token on.
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    routing: RoutingKeys = RoutingKeys()
    first_token_id: int | None = None
    """None with a ``kv_handle``: a pipelined handle, whose export tells the first token."""
    kv_handle: KVHandle | None = None
    prompt_chunk_ends: tuple[int, ...] = ()
    """The prefill's chunk ends (``PrefillResult.prompt_chunk_ends``), for a recompute."""
    warm_from: PrefixExport | None = None
    """A request handed off by a leaving decode replica (a local prefill of its prompt and the
    tokens so far): the blocks that replica exported, pulled into this one's cache before the
    prefill, which then computes only what they miss (a failed pull: all of it)."""


@dataclass(frozen=True)
class TokenChunk:
    """Decode -> ingress, one per engine step that advanced the request.

    ``error`` is set on a failed request's last chunk (``finish_reason="error"``); the ingress
    turns it back into the same typed error (an SSE error event mid-stream).
    """

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    error: ErrorReport | None = None
    logprobs: tuple[TokenLogprobs, ...] = ()
    """One per token of ``token_ids`` when the request asked for ``logprobs``."""
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = ()
    """On a local prefill's first chunk, when the request asked for ``prompt_logprobs``."""
    stage_times: StageTimes | None = None
    """On a stream's first chunk with tokens: a local prefill's queue and prefill time, or an
    import's transfer and first-decode time."""
    handoff: PrefixExport | None = None
    """On the aborted last chunk of a request its leaving replica handed off: its computed
    blocks (prompt and tokens so far), exported for the replica that continues it
    (``DecodeRequest.warm_from``); None: continue it by recompute."""


@dataclass(frozen=True)
class WarmPrefixRequest:
    """A router asks ``target_replica_id`` to hold a hot prefix's KV ahead of its requests:
    pull ``block_hashes`` (a prompt's leading blocks, chained) from ``source_replica_id``'s
    prefix cache over the KV transfer, or onload them from its own host or disk tier, never
    recompute them. The blocks then live in its prefix cache under its normal LRU."""

    pool: str
    """The pool key (``core.config.pool_key``) both replicas serve."""
    prefix_head: BlockHash
    """The hash naming the prefix (``cluster.routing.prefix_heat.prefix_head``)."""
    block_hashes: tuple[BlockHash, ...]
    source_replica_id: str
    target_replica_id: str
    num_bytes: int = 0
    """KV bytes the router expects to move (blocks times the source's block bytes)."""

    def __post_init__(self) -> None:
        if not self.block_hashes:
            raise MessageError("WarmPrefixRequest needs at least one block hash")
        if self.source_replica_id == self.target_replica_id:
            raise MessageError(f"WarmPrefixRequest from replica {self.source_replica_id} to itself")


@dataclass(frozen=True)
class PrefixExport:
    """A holder's answer to a :class:`WarmPrefixRequest`: the leading run of its blocks that
    its prefix cache still held, pinned under ``handle``'s lease until the target pulls them
    (or releases the handle, or the lease expires)."""

    block_hashes: tuple[BlockHash, ...]
    """The exported blocks' hashes, leading block first (``handle.num_blocks`` of them)."""
    handle: KVHandle

    def __post_init__(self) -> None:
        if len(self.block_hashes) != self.handle.num_blocks:
            raise MessageError(
                f"PrefixExport names {len(self.block_hashes)} block hashes for an export of "
                f"{self.handle.num_blocks} blocks"
            )


@dataclass(frozen=True)
class PrefixCopyCall:
    """A router's call to one replica about a hot-prefix copy: to its holder (``export`` None:
    export the blocks) or to its target (pull ``export``). ``routing.replica_id`` names the
    replica, so the pool's request router sends it there and nowhere else."""

    request: WarmPrefixRequest
    routing: RoutingKeys
    export: PrefixExport | None = None
