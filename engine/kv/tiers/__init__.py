"""The KV memory hierarchy below the device pool: host-RAM and disk tiers (see ``store``)."""

from engine.kv.tiers.store import FinishedLoad, KVTiers

__all__ = ["FinishedLoad", "KVTiers"]
