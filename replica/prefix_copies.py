"""Both ends of a deliberate hot-prefix copy on one replica, as its Serve deployment offers them
(``RoleReplica.export_prefix`` / ``RoleReplica.warm_prefix``).

:class:`PrefixCopies` joins the pieces for one worker: as the holder it exports a prefix's
cached blocks through the worker's own transport (``replica.prefix_export``; the transport must
serve exports), as the target it pulls an export into a scratch store over a transport of the
same transfer settings (``replica.prefix_pull``) and admits the blocks into the engine's host
tier (``replica.prefix_admit``), checked and reported by a
:class:`~replica.prefix_warming.PrefixWarmer`. A request a leaving decode replica handed off
arrives with its blocks' export, pulled the same way (:meth:`PrefixCopies.pull_handed_off`).
"""

from __future__ import annotations

from core.config import Role, split_pool_key
from core.errors import MessageError
from core.messages import PrefixExport, WarmPrefixRequest
from engine.async_engine import AsyncEngine
from replica.prefix_admit import EnginePrefixAdmitter
from replica.prefix_export import PrefixExporter
from replica.prefix_pull import TransportFactory, TransportPrefixSource
from replica.prefix_warming import PrefixWarmer, WarmPrefixResult
from transfer import KVTransport


class PrefixCopies:
    """Exports and warms hot prefixes for one replica of one role."""

    def __init__(
        self,
        replica_id: str,
        role: Role,
        engine: AsyncEngine,
        transport: KVTransport,
        make_pull_transport: TransportFactory,
        *,
        pull_timeout_s: float,
    ) -> None:
        self.replica_id = replica_id
        self.role = role
        self.exporter = PrefixExporter(engine, transport)
        self._source = TransportPrefixSource(
            engine.layout, make_pull_transport, timeout_s=pull_timeout_s
        )
        self._admitter = EnginePrefixAdmitter(engine)

    async def export(self, request: WarmPrefixRequest) -> PrefixExport | None:
        """As the holder: export what the prefix cache holds of ``request.block_hashes``
        (None: not even its first block); ``TransferError`` when the transport refuses."""
        self._check(request, request.source_replica_id)
        return await self.exporter.export(request.block_hashes)

    async def warm(self, request: WarmPrefixRequest, export: PrefixExport) -> WarmPrefixResult:
        """As the target: pull ``export`` and admit it (see ``PrefixWarmer.warm``)."""
        self._check(request, request.target_replica_id)
        warmer = PrefixWarmer(self.replica_id, request.pool, self._source, self._admitter)
        return await warmer.warm(request, export)

    async def pull_handed_off(self, export: PrefixExport) -> WarmPrefixResult:
        """As the replica continuing a request a leaving one handed off
        (``DecodeRequest.warm_from``): pull the blocks it exported into this engine's cache
        (refused across KV fingerprints; a failure is a result with its reason)."""
        request = WarmPrefixRequest(
            pool=self.role,
            prefix_head=export.block_hashes[0],
            block_hashes=export.block_hashes,
            source_replica_id=export.handle.address,
            target_replica_id=self.replica_id,
        )
        return await self.warm(request, export)

    def _check(self, request: WarmPrefixRequest, replica_id: str) -> None:
        role, _ = split_pool_key(request.pool)
        if role != self.role or replica_id != self.replica_id:
            raise MessageError(
                f"warm-prefix request of pool {request.pool!r} for replica {replica_id} reached "
                f"{self.role} replica {self.replica_id}"
            )
