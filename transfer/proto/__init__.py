"""The versioned wire protocol of the KV data plane (kv_transfer.proto)."""
