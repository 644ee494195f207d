"""One request's path through the pools: the pool clients, conditional disaggregation, the
prefill breaker, migration and the TTFT breakdown."""
