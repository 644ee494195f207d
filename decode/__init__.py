"""The decode role: engine with KV import plus token streaming."""
