"""The KV hand-off, transport side: the connector a role worker attaches to its engine (exports
and pulls over the transfer layer: gRPC or same-node) and a decode import's reservation."""

from replica.kv_connector.kv_import import KVImport
from replica.kv_connector.transport_connector import FinishedExport, TransportKVConnector

__all__ = ["FinishedExport", "KVImport", "TransportKVConnector"]
