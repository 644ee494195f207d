"""The dispatch floor of the ingress: one request's path through the pools (the pool clients,
the path choice, remote prefill and its failover, the decode stream and its migration, the
run's accounting, the TTFT breakdown). It imports only the shared HTTP helpers, telemetry
and settings below it."""
