"""What the ingress measures and exposes: request metrics, the replicas' stats and KV tiers as
Prometheus families, and recent latency for the planner."""
