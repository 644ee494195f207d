"""The KV index's storage: who holds which hash in which medium, and the prefix walk over it.

:class:`Holders` keeps, per pool, ``hash -> (device holders, host-or-disk holders)`` as bitmasks
of replica slots, and per replica (:class:`ReplicaEntries`) ``hash -> media bits``. The walk in
:meth:`Holders.match` follows the engine's lookup: a run of leading blocks on the device, then a
run held in the host or disk tier, ending at the first block held in neither. A block in both
host and disk counts as host (the engine loads it from there).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cluster.routing.kv_index.ops import DEVICE_BIT, LOWER_BITS, MEDIUM_BITS
from core.hashing import BlockHash

_HOST_BIT = MEDIUM_BITS["host"]


@dataclass
class ReplicaEntries:
    """One replica's place in the index: pool, bit slot, event seq, health and entries."""

    pool: str
    slot: int
    last_seq: int
    degraded: bool = False
    media: dict[BlockHash, int] = field(default_factory=dict)
    """hash -> ``MEDIUM_BITS`` mask of the media holding it."""

    def hashes_in(self, medium: str) -> set[BlockHash]:
        """The hashes held in ``medium``."""
        bit = MEDIUM_BITS[medium]
        return {h for h, bits in self.media.items() if bits & bit}


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
    """Per pool: hash -> (device holders, lower-tier holders) slot bitmasks."""

    def __init__(self) -> None:
        self._pools: dict[str, dict[BlockHash, tuple[int, int]]] = {}

    def num_hashes(self) -> int:
        """Distinct (pool, hash) pairs held anywhere."""
        return sum(len(h) for h in self._pools.values())

    def store(self, replica: ReplicaEntries, hashes: Iterable[BlockHash], bit: int) -> None:
        """``replica`` now holds ``hashes`` in the medium of ``bit``."""
        holders = self._pools.setdefault(replica.pool, {})
        slot_bit = 1 << replica.slot
        for block_hash in hashes:
            bits = replica.media.get(block_hash, 0) | bit
            replica.media[block_hash] = bits
            holders[block_hash] = _masks(holders.get(block_hash, (0, 0)), slot_bit, bits)

    def remove(self, replica: ReplicaEntries, hashes: Iterable[BlockHash], bit: int) -> None:
        """``replica`` no longer holds ``hashes`` in the medium of ``bit``."""
        holders = self._pools.get(replica.pool, {})
        slot_bit = 1 << replica.slot
        for block_hash in hashes:
            bits = replica.media.get(block_hash, 0)
            if not bits & bit:
                continue
            bits &= ~bit
            if bits:
                replica.media[block_hash] = bits
            else:
                del replica.media[block_hash]
            masks = _masks(holders.get(block_hash, (0, 0)), slot_bit, bits)
            if masks == (0, 0):
                holders.pop(block_hash, None)
            else:
                holders[block_hash] = masks

    def clear(self, replica: ReplicaEntries) -> None:
        """Drop every entry of ``replica``."""
        for bit in MEDIUM_BITS.values():
            self.remove(replica, list(replica.media), bit)

    def match(
        self, pool: str, block_hashes: Sequence[BlockHash], alive: int
    ) -> dict[int, tuple[int, int]]:
        """``slot -> (device run, whole usable run)`` for the slots in ``alive`` with a hit."""
        holders = self._pools.get(pool)
        if not holders or not block_hashes:
            return {}
        on_device = alive
        num_device: dict[int, int] = {}
        num_total: dict[int, int] = {}
        for i, block_hash in enumerate(block_hashes):
            device, lower = holders.get(block_hash, (0, 0))
            still_device = on_device & device
            still = still_device | (alive & lower)
            _note(on_device & ~still_device, i, num_device)
            _note(alive & ~still, i, num_total)
            alive, on_device = still, still_device
            if not alive:
                break
        _note(on_device, len(block_hashes), num_device)
        _note(alive, len(block_hashes), num_total)
        return {slot: (num_device.get(slot, 0), n) for slot, n in num_total.items() if n}


def split_hit(
    replica: ReplicaEntries, block_hashes: Sequence[BlockHash], runs: tuple[int, int]
) -> TierHit:
    """The :class:`TierHit` of a ``(device run, usable run)`` pair from :meth:`Holders.match`."""
    num_device, num_total = runs
    lower_run = block_hashes[num_device:num_total]
    num_host = sum(1 for h in lower_run if replica.media.get(h, 0) & _HOST_BIT)
    return TierHit(num_device, num_host, len(lower_run) - num_host)


def _masks(masks: tuple[int, int], slot_bit: int, bits: int) -> tuple[int, int]:
    """``(device, lower)`` holder masks with one replica's bit set from its media ``bits``."""
    device, lower = masks[0] & ~slot_bit, masks[1] & ~slot_bit
    if bits & DEVICE_BIT:
        device |= slot_bit
    if bits & LOWER_BITS:
        lower |= slot_bit
    return device, lower


def _note(mask: int, count: int, into: dict[int, int]) -> None:
    """Record ``count`` for every slot in ``mask``."""
    while mask:
        low = mask & -mask
        into[low.bit_length() - 1] = count
        mask ^= low
