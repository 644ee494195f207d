"""The OpenAI / vLLM API shapes: request schemas, prompt building, sampling and structured-output
fields, response bodies and the two generation handlers."""
