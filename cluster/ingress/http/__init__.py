"""The HTTP surface of the ingress: the FastAPI app, its guards and admission, route groups,
error bodies and SSE framing."""
