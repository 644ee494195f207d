"""Per-request block tables and prefix-cache lookups on top of the :class:`BlockPool`.

A request's table lists its block ids in token order: token ``p`` lives in block
``table[p // block_size]`` at offset ``p % block_size``. A block joins the prefix cache, under
the chained hash of ``core.hashing`` (the function the cluster router uses, so its predictions
are real hits), once every token in it is *computed* — prompt blocks during prefill, later ones
during decode — and a later request whose tokens start with the same blocks shares those ids.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.errors import KVCacheError
from core.hashing import BlockHash, hash_block, root_hash
from core.kv_events import BlockStored
from engine.kv.block_pool import NULL_BLOCK_ID, BlockPool
from engine.kv.event_publisher import KVEventPublisher
from engine.request import Request


@dataclass(frozen=True)
class ComputedBlocks:
    """A prefix-cache hit: cached block ids covering the first ``num_tokens`` tokens."""

    block_ids: list[int]
    num_tokens: int


NO_HIT = ComputedBlocks(block_ids=[], num_tokens=0)


class BlockRelease(enum.Enum):
    """A before-free listener's answer: may the request's blocks go back to the pool now?"""

    NOW = "now"
    """Nothing of the listener's touches them any more."""
    HELD = "held"
    """A copy still writes them: the manager holds them until
    :meth:`KVCacheManager.release_held`."""


BeforeFree = Callable[[str], BlockRelease | None]
"""A before-free listener (None answers :attr:`BlockRelease.NOW`)."""


class KVCacheManager:
    """Owns every request's block table; allocates, caches and frees through the pool."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        hash_seed: int,
        enable_prefix_caching: bool = True,
        publisher: KVEventPublisher | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.hash_seed = hash_seed
        self._publisher = publisher or KVEventPublisher()
        self.pool = (
            BlockPool(num_blocks, self._publisher)
            if clock is None
            else BlockPool(num_blocks, self._publisher, clock=clock)
        )
        self._tables: dict[str, list[int]] = {}
        self._num_offered_blocks: dict[str, int] = {}  # leading blocks already offered to cache
        self._cached_listeners: list[Callable[[int, BlockHash], None]] = []
        self._before_free_listeners: list[BeforeFree] = []
        self._held: dict[str, list[list[int]]] = {}  # tables freed while a copy still writes
        self._pins: dict[str, list[int]] = {}  # cached blocks an export of a prefix reads

    # -- listeners ----------------------------------------------------------------------------

    def register_cached_listener(self, listener: Callable[[int, BlockHash], None]) -> None:
        """Call ``listener(block id, hash)`` for each block that joins the prefix cache."""
        self._cached_listeners.append(listener)

    def register_before_free(self, listener: BeforeFree) -> None:
        """Call ``listener(request id)`` just before a request's blocks are freed (for any
        reason): whoever still reads them from another thread (a pipelined export) must stop
        first; one that cannot stop at once (a pull being cancelled) answers
        :attr:`BlockRelease.HELD` and the blocks stay out of the pool until
        :meth:`release_held`. Listeners run in registration order."""
        self._before_free_listeners.append(listener)

    # -- inspection ---------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now (free plus evictable cached)."""
        return self.pool.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache, held or not."""
        return self.pool.num_cached_blocks

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by requests."""
        return self.pool.usage

    def block_ids(self, request_id: str) -> list[int]:
        """A copy of the request's block table (empty when it holds none)."""
        return list(self._tables.get(request_id, ()))

    def block_tables(self) -> dict[str, list[int]]:
        """Copies of every table, by request id."""
        return {request_id: list(table) for request_id, table in self._tables.items()}

    def blocks_for_tokens(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    # -- hashing and lookup -------------------------------------------------------------------

    def block_hashes(self, request: Request, num_blocks: int) -> list[BlockHash]:
        """Chained hashes of the request's first ``num_blocks`` full token blocks (fewer if it
        has fewer full blocks); extends ``request.block_hashes`` incrementally."""
        hashes = request.block_hashes
        target = min(num_blocks, request.num_tokens // self.block_size)
        if hashes:
            parent = hashes[-1]
        else:
            parent = root_hash(self.hash_seed, request.cache_salt, request.lora_name)
        tokens = request.all_token_ids
        for index in range(len(hashes), target):
            start = index * self.block_size
            parent = hash_block(parent, tokens[start : start + self.block_size])
            hashes.append(parent)
        return hashes[:target]

    def get_computed_blocks(self, request: Request, max_tokens: int) -> ComputedBlocks:
        """The longest cached prefix of the request covering at most ``max_tokens`` tokens.

        The scheduler passes ``num_tokens - 1`` for requests it computes (the last token must
        run so its logits exist) and the prompt length for imports. Nothing is touched.
        """
        if not self.enable_prefix_caching or max_tokens < self.block_size:
            return NO_HIT
        block_ids: list[int] = []
        for block_hash in self.block_hashes(request, max_tokens // self.block_size):
            block_id = self.pool.lookup(block_hash)
            if block_id is None:
                break
            block_ids.append(block_id)
        return ComputedBlocks(block_ids=block_ids, num_tokens=len(block_ids) * self.block_size)

    # -- allocation ---------------------------------------------------------------------------

    def can_allocate(
        self, request: Request, num_new_tokens: int, computed: ComputedBlocks = NO_HIT
    ) -> bool:
        """True when :meth:`allocate_slots` with the same arguments would succeed."""
        num_new_blocks, num_revived = self._blocks_to_take(request, num_new_tokens, computed)
        return self.pool.can_allocate(num_new_blocks + num_revived)

    def allocate_slots(
        self, request: Request, num_new_tokens: int, computed: ComputedBlocks = NO_HIT
    ) -> bool:
        """Grow the table to hold ``num_computed_tokens + computed.num_tokens + num_new_tokens``
        tokens, first adopting the ``computed`` prefix hit (which must be the table's start).
        Returns False and changes nothing when the pool is short of blocks."""
        table = self._tables.get(request.request_id, [])
        if computed.block_ids and table:
            raise KVCacheError(f"request {request.request_id}: prefix hit on a non-empty table")
        num_new_blocks, num_revived = self._blocks_to_take(request, num_new_tokens, computed)
        if not self.pool.can_allocate(num_new_blocks + num_revived):
            return False
        if request.request_id not in self._tables:
            self._tables[request.request_id] = table
            self._num_offered_blocks[request.request_id] = len(computed.block_ids)
        self.pool.touch(computed.block_ids)
        table.extend(computed.block_ids)
        if num_new_blocks > 0:
            table.extend(self.pool.allocate(num_new_blocks))
        return True

    def _blocks_to_take(
        self, request: Request, num_new_tokens: int, computed: ComputedBlocks
    ) -> tuple[int, int]:
        """(new blocks to allocate, cached-free hit blocks to revive) for this growth."""
        num_held = len(self._tables.get(request.request_id, ()))
        total_tokens = request.num_computed_tokens + computed.num_tokens + num_new_tokens
        num_new_blocks = self.blocks_for_tokens(total_tokens) - num_held - len(computed.block_ids)
        num_revived = sum(1 for b in computed.block_ids if self.pool.blocks[b].ref_cnt == 0)
        return max(num_new_blocks, 0), num_revived

    def cache_full_blocks(self, request: Request) -> None:
        """Offer the request's newly full, computed blocks to the prefix cache (in order) and
        record one ``BlockStored`` event per run of blocks that were actually added."""
        request_id = request.request_id
        if not self.enable_prefix_caching or request_id not in self._tables:
            return
        table = self._tables[request_id]
        num_full = min(request.num_computed_tokens // self.block_size, len(table))
        start = self._num_offered_blocks[request_id]
        if num_full <= start:
            return
        hashes = self.block_hashes(request, num_full)
        run: list[int] = []
        for index in range(start, num_full):
            if self.pool.cache_block(table[index], hashes[index]):
                run.append(index)
                for listener in self._cached_listeners:
                    listener(table[index], hashes[index])
                continue
            self._record_stored(request, run)
            run = []
        self._record_stored(request, run)
        self._num_offered_blocks[request_id] = num_full

    def _record_stored(self, request: Request, indices: list[int]) -> None:
        if not indices:
            return
        first, last = indices[0], indices[-1]
        hashes = request.block_hashes
        self._publisher.record(
            BlockStored(
                block_hashes=hashes[first : last + 1],
                parent_hash=hashes[first - 1] if first > 0 else None,
                token_ids=request.all_token_ids[
                    first * self.block_size : (last + 1) * self.block_size
                ],
                block_size=self.block_size,
            )
        )

    def release_leading(self, request_id: str, num_blocks: int) -> int:
        """Free the request's first ``num_blocks`` blocks, which it never reads again (they left
        its sliding window): their table entries become the null block. Cached blocks stay in
        the prefix cache (another request may still hit them). Returns how many were freed."""
        table = self._tables.get(request_id)
        if not table:
            return 0
        count = min(num_blocks, len(table))
        released = [block_id for block_id in table[:count] if block_id != NULL_BLOCK_ID]
        if released:
            table[:count] = [NULL_BLOCK_ID] * count
            self.pool.free(released[::-1])
        return len(released)

    def free(self, request_id: str, keep_s: float = 0.0) -> None:
        """Release the request's whole table, tail block first (the prefix stays cached
        longest), its idle clock starting ``keep_s`` late (a keep-alive); a request without a
        table is a no-op. A listener answering HELD keeps the table out of the pool until
        :meth:`release_held`."""
        written = False  # a copy still writes the blocks
        if request_id in self._tables:
            for listener in self._before_free_listeners:
                written = listener(request_id) is BlockRelease.HELD or written
        table = self._tables.pop(request_id, None)
        self._num_offered_blocks.pop(request_id, None)
        if table and written:
            self._held.setdefault(request_id, []).append(table)
        elif table:  # entries released behind a sliding window are the null block
            held = [block_id for block_id in table[::-1] if block_id != NULL_BLOCK_ID]
            self.pool.free(held, keep_s=keep_s)

    def release_held(self, request_id: str) -> None:
        """The copy into a held table of ``request_id`` stopped: free that table (the oldest
        held one; a no-op when none is held)."""
        tables = self._held.get(request_id)
        if not tables:
            return
        table = tables.pop(0)
        if not tables:
            del self._held[request_id]
        self.pool.free([block_id for block_id in table[::-1] if block_id != NULL_BLOCK_ID])

    @property
    def num_held_blocks(self) -> int:
        """Blocks freed by their request but held while a copy still writes them."""
        return sum(len(table) for tables in self._held.values() for table in tables)

    def reset_prefix_cache(self) -> None:
        """Drop every cached hash; held blocks are never offered again."""
        self.pool.reset_prefix_cache()
        for request_id, table in self._tables.items():
            self._num_offered_blocks[request_id] = len(table)

    def admit_blocks(
        self, block_hashes: Sequence[BlockHash], write: Callable[[int, int], None]
    ) -> int:
        """Blocks pulled from another replica (a handed-off request's, a hot prefix's) straight
        into the prefix cache, for an engine without a host tier: for each hash in order, one
        already cached counts as is, else a free block (never a held one; an evictable cached
        one is evicted as by any allocation) takes ``write(index, block_id)`` and joins the
        cache, unheld, under that hash. Stops at the first it cannot place (none free, caching
        off); returns how many of the leading run are cached now. One ``BlockStored`` event
        names the blocks added."""
        if not self.enable_prefix_caching:
            return 0
        held: list[int] = []  # the run so far, held so that placing the next evicts none of it
        added: list[BlockHash] = []
        for index, block_hash in enumerate(block_hashes):
            block_id = self.pool.lookup(block_hash)
            if block_id is not None:
                self.pool.touch([block_id])
            elif self.pool.can_allocate(1):
                (block_id,) = self.pool.allocate(1)
                write(index, block_id)
                self.pool.cache_block(block_id, block_hash)
                added.append(block_hash)
            else:
                break
            held.append(block_id)
        self.pool.free(held[::-1])  # tail first: the prefix is evicted last
        if added:
            self._publisher.record(BlockStored(added, None, [], self.block_size))
        return len(held)

    # -- pins of cached prefixes (a hot prefix's export) --------------------------------------

    def pin_cached(self, pin_id: str, block_hashes: Sequence[BlockHash]) -> list[int]:
        """Hold the leading run of ``block_hashes`` the prefix cache holds, under ``pin_id``
        (not a request: another thread reads their KV for an export), until :meth:`unpin`.
        Returns their block ids, leading block first; empty when the first is not cached."""
        if pin_id in self._pins:
            raise KVCacheError(f"KV pin {pin_id} already holds blocks")
        block_ids: list[int] = []
        for block_hash in block_hashes:
            block_id = self.pool.lookup(block_hash)
            if block_id is None:
                break
            block_ids.append(block_id)
        if block_ids:
            self.pool.touch(block_ids)
            self._pins[pin_id] = block_ids
        return list(block_ids)

    def unpin(self, pin_id: str) -> bool:
        """Let a pin's blocks go (they stay cached, last block evicted first); False when
        ``pin_id`` holds nothing (never pinned, or already unpinned)."""
        block_ids = self._pins.pop(pin_id, None)
        if block_ids is None:
            return False
        self.pool.free(block_ids[::-1])
        return True

    @property
    def num_pinned_prefix_blocks(self) -> int:
        """Blocks held by :meth:`pin_cached` pins now."""
        return sum(len(block_ids) for block_ids in self._pins.values())

    # -- integrity ----------------------------------------------------------------------------

    def check_integrity(self) -> None:
        """Pool integrity plus: each block's ref count equals the tables (and pins) holding it."""
        self.pool.check_integrity()
        held = [table for tables in self._held.values() for table in tables]
        holders = Counter(
            block_id
            for table in [*self._tables.values(), *held, *self._pins.values()]
            for block_id in table
            if block_id != NULL_BLOCK_ID
        )
        for block in self.pool.blocks:
            if block.ref_cnt != holders.get(block.block_id, 0):
                raise KVCacheError(
                    f"KV integrity: block {block.block_id} has ref {block.ref_cnt} but "
                    f"{holders.get(block.block_id, 0)} tables hold it"
                )
