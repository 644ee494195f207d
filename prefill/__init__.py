"""The prefill role: engine in prefill-only mode plus the KV export side."""
