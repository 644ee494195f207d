"""The KV hand-off, engine side: the connector contract, its in-process implementation and the
scheduler's export/import bookkeeping (``connected_engine``, ``export_progress``, ``imports``
and ``import_loads`` are imported by their module paths: they sit on the engine and scheduler)."""

from engine.kv_connector.base import (
    ImportEnded,
    ImportResult,
    KVConnector,
    KVConnectorFinished,
    KVImportSource,
)
from engine.kv_connector.inproc import InProcKVConnector, InProcKVHub

__all__ = [
    "ImportEnded",
    "ImportResult",
    "InProcKVConnector",
    "InProcKVHub",
    "KVConnector",
    "KVConnectorFinished",
    "KVImportSource",
]
