"""The bottom floor of the ingress: shared HTTP helpers (OpenAI error bodies, SSE framing,
JSON bodies, the outer guard, admission); nothing here imports a floor above."""
