"""The KV hand-off, engine side: the connector contract, its in-process implementation and how
an engine drives connectors (``settle``, ``connected_engine``, ``attached`` and
``export_progress`` are imported by their module paths: they sit on the engine)."""

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
