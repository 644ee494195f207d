"""The KV hand-off, transport side: one prefill's pipelined export and one decode import over
the transfer layer (gRPC or same-node pulls)."""

from replica.kv_connector.kv_import import KVImport
from replica.kv_connector.pipelined_export import PipelinedExport

__all__ = ["KVImport", "PipelinedExport"]
