"""The KV index's storage: who holds which hash in which medium, and the prefix walk over it.

:class:`Holders` keeps, per pool and per medium (device, host, disk), ``hash -> holders``. The
holders value is encoded to stay small at a thousand replicas: a hash held by one replica (most
of them: a session's blocks live where the session is pinned) stores that replica's **slot**, a
small int; a hash held by several stores the **complement of their slot bitmask** (a negative
int), so one bit per replica is paid only where a block is really shared. Each replica
(:class:`ReplicaEntries`) keeps the hashes it holds in any medium (sharing the key objects of
the holder dicts), which is what dropping its entries needs.
``benchmarks/control_plane_scale.py`` measures the bytes per (block, replica) entry this gives.

The walk in :meth:`Holders.match` follows the engine's lookup: a run of leading blocks on the
device, then a run held in the host or disk tier, ending at the first block held in neither. A
block in both host and disk counts as host (the engine loads it from there).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from cluster.routing.kv_index.compaction import DEVICE_BIT, HOST_BIT, MEDIUM_BITS
from core.hashing import BlockHash

_HOST_BIT = HOST_BIT
_DISK_BIT = MEDIUM_BITS["disk"]
_FEW_SLOTS = 8  # masks with more set bits are expanded to slots by numpy

Encoded = int
"""A holders value: ``slot >= 0`` for one holder, ``~mask < 0`` for several."""


@dataclass
class ReplicaEntries:
    """One replica's place in the index: pool, bit slot, event seq, health and entry count."""

    pool: str
    slot: int
    last_seq: int
    degraded: bool = False
    held: dict[BlockHash, None] = field(default_factory=dict)
    """The hashes it holds in any medium (a dict as a set: half a set's bytes per entry)."""

    @property
    def num_entries(self) -> int:
        """Distinct hashes held in any medium."""
        return len(self.held)


@dataclass(frozen=True)
class TierHit:
    """A replica's usable prefix for one prompt, by the medium each block comes from."""

    num_device: int = 0
    num_host: int = 0
    num_disk: int = 0

    @property
    def num_blocks(self) -> int:
        """Leading prompt blocks the replica can serve without recompute."""
        return self.num_device + self.num_host + self.num_disk


class Holders:
    """Per pool and medium: hash -> encoded holders (see the module docstring)."""

    def __init__(self) -> None:
        self._pools: dict[str, dict[int, dict[BlockHash, Encoded]]] = {}
        self._num_hashes: dict[str, int] = {}

    def num_hashes(self) -> int:
        """Distinct (pool, hash) pairs held anywhere."""
        return sum(self._num_hashes.values())

    def store(self, replica: ReplicaEntries, hashes: Iterable[BlockHash], bit: int) -> None:
        """``replica`` now holds ``hashes`` in the medium of ``bit``."""
        media = self._media(replica.pool)
        target = media[bit]
        others = [d for b, d in media.items() if b != bit and d]
        slot, held = replica.slot, replica.held
        new_hashes = 0
        for block_hash in hashes:
            value = target.get(block_hash)
            if value is None:
                target[block_hash] = slot
                # ``not others`` first: no host or disk tier (the common case) costs nothing
                if not others or not any(block_hash in d for d in others):
                    new_hashes += 1
            elif value == slot or (value < 0 and (~value >> slot) & 1):
                continue
            else:
                target[block_hash] = _with(value, slot)
            held[block_hash] = None
        self._num_hashes[replica.pool] += new_hashes

    def remove(self, replica: ReplicaEntries, hashes: Iterable[BlockHash], bit: int) -> None:
        """``replica`` no longer holds ``hashes`` in the medium of ``bit``."""
        media = self._pools.get(replica.pool)
        if media is None:
            return
        target = media[bit]
        others = [d for b, d in media.items() if b != bit and d]
        slot, held = replica.slot, replica.held
        gone_hashes = 0
        for block_hash in hashes:
            value = target.get(block_hash)
            if value == slot:
                rest = None
            elif value is not None and value < 0 and (~value >> slot) & 1:
                rest = _without(value, slot)
            else:
                continue
            if rest is None:
                del target[block_hash]
                if not others or not any(block_hash in d for d in others):
                    gone_hashes += 1
            else:
                target[block_hash] = rest
            if not others or not any(_holds(d.get(block_hash), slot) for d in others):
                held.pop(block_hash, None)
        self._num_hashes[replica.pool] -= gone_hashes

    def clear(self, replica: ReplicaEntries) -> None:
        """Drop every entry of ``replica``."""
        media = self._pools.get(replica.pool)
        if media is not None:
            hashes = list(replica.held)
            for bit in media:
                self.remove(replica, hashes, bit)
        replica.held = {}

    def hashes_of(self, replica: ReplicaEntries, bit: int) -> set[BlockHash]:
        """The hashes ``replica`` holds in the medium of ``bit``."""
        media = self._pools.get(replica.pool)
        if media is None:
            return set()
        target = media[bit]
        return {h for h in replica.held if _holds(target.get(h), replica.slot)}

    def holds(self, replica: ReplicaEntries, block_hash: BlockHash, bit: int) -> bool:
        """True when ``replica`` holds ``block_hash`` in the medium of ``bit``."""
        media = self._pools.get(replica.pool)
        return media is not None and _holds(media[bit].get(block_hash), replica.slot)

    def match(
        self, pool: str, block_hashes: Sequence[BlockHash], alive: int
    ) -> dict[int, tuple[int, int]]:
        """``slot -> (device run, whole usable run)`` for the slots in ``alive`` with a hit."""
        media = self._pools.get(pool)
        if not media or not block_hashes:
            return {}
        device, host, disk = media[DEVICE_BIT], media[_HOST_BIT], media[_DISK_BIT]
        has_lower = bool(host or disk)
        on_device = alive
        num_device: dict[int, int] = {}
        num_total: dict[int, int] = {}
        for i, block_hash in enumerate(block_hashes):
            value = device.get(block_hash)
            if value is None:
                still_device = 0
            else:
                still_device = on_device & ((1 << value) if value >= 0 else ~value)
            if has_lower:
                lower = _mask(host.get(block_hash)) | _mask(disk.get(block_hash))
                still = still_device | (alive & lower)
            else:
                still = still_device
            if still_device != on_device:
                _note(on_device & ~still_device, i, num_device)
            if still != alive:
                _note(alive & ~still, i, num_total)
            alive, on_device = still, still_device
            if not alive:
                break
        _note(on_device, len(block_hashes), num_device)
        _note(alive, len(block_hashes), num_total)
        if not has_lower:  # every run is a device run
            return {slot: (n, n) for slot, n in num_total.items() if n}
        return {slot: (num_device.get(slot, 0), n) for slot, n in num_total.items() if n}

    def split_hit(
        self, replica: ReplicaEntries, block_hashes: Sequence[BlockHash], runs: tuple[int, int]
    ) -> TierHit:
        """The :class:`TierHit` of a ``(device run, usable run)`` pair from :meth:`match`."""
        num_device, num_total = runs
        if num_device == num_total:
            return TierHit(num_device)
        lower_run = block_hashes[num_device:num_total]
        num_host = sum(1 for h in lower_run if self.holds(replica, h, _HOST_BIT))
        return TierHit(num_device, num_host, len(lower_run) - num_host)

    def _media(self, pool: str) -> dict[int, dict[BlockHash, Encoded]]:
        media = self._pools.get(pool)
        if media is None:
            media = self._pools[pool] = {bit: {} for bit in MEDIUM_BITS.values()}
            self._num_hashes[pool] = 0
        return media


def _holds(value: Encoded | None, slot: int) -> bool:
    if value is None:
        return False
    return value == slot if value >= 0 else bool((~value >> slot) & 1)


def _mask(value: Encoded | None) -> int:
    if value is None:
        return 0
    return (1 << value) if value >= 0 else ~value


def _with(value: Encoded, slot: int) -> Encoded:
    """``value``'s holders plus ``slot`` (two or more: always the mask form)."""
    return ~(_mask(value) | (1 << slot))


def _without(value: Encoded, slot: int) -> Encoded | None:
    """``value``'s holders less ``slot``; ``None`` when none is left."""
    mask = _mask(value) & ~(1 << slot)
    if not mask:
        return None
    if mask & (mask - 1):
        return ~mask
    return mask.bit_length() - 1


def _note(mask: int, count: int, into: dict[int, int]) -> None:
    """Record ``count`` for every slot in ``mask``."""
    if mask.bit_count() <= _FEW_SLOTS:
        while mask:
            low = mask & -mask
            into[low.bit_length() - 1] = count
            mask ^= low
        return
    packed = np.frombuffer(mask.to_bytes((mask.bit_length() + 7) // 8, "little"), np.uint8)
    slots = np.flatnonzero(np.unpackbits(packed, bitorder="little"))
    into.update(dict.fromkeys(slots.tolist(), count))
