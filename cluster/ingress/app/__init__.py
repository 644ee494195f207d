"""The top floor of the ingress: the FastAPI app and its route groups (generation, models,
tokenizer, probes, metrics, fault injection), wired over the protocol handlers below."""
