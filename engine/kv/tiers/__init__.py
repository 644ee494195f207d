"""The KV memory hierarchy below the device pool: host-RAM and disk tiers.

``store.KVTiers`` is the entry point (it needs torch); ``entries``, ``counters`` and ``loads``
are plain bookkeeping the tensor-free scheduler may import.
"""
