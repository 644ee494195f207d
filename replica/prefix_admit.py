"""The target's :class:`~replica.prefix_warming.PrefixAdmitter`: pulled prefix blocks into the
engine's host tier (``LLMEngine.admit_prefix``), on the engine thread."""

from __future__ import annotations

from engine.async_engine import AsyncEngine
from replica.prefix_warming import PulledBlocks


class EnginePrefixAdmitter:
    """Admits pulled blocks into one engine's host tier."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def admit(self, blocks: PulledBlocks) -> int:
        """How many of a leading run of ``blocks`` the host tier took."""
        return await self._engine.call(
            lambda engine: engine.admit_prefix(blocks.block_hashes, blocks.payloads)
        )
