"""The OpenAI-compatible HTTP ingress: validation, tokenization, disaggregation, SSE, metrics."""

from cluster.ingress.app.fastapi_app import IngressApp, create_app
from cluster.ingress.dispatch.disagg import (
    CachedBlocksFn,
    DisaggDecision,
    DisaggPolicy,
    DisaggReason,
)
from cluster.ingress.dispatch.pool_clients import DecodeClient, PrefillClient, StatsProvider
from cluster.ingress.http.api_keys import authenticate
from cluster.ingress.http.request_gate import RequestGate
from cluster.ingress.prompt_tokenizer import PromptTokenizer
from cluster.ingress.settings import IngressSettings

__all__ = [
    "CachedBlocksFn",
    "DecodeClient",
    "DisaggDecision",
    "DisaggPolicy",
    "DisaggReason",
    "IngressApp",
    "IngressSettings",
    "PrefillClient",
    "PromptTokenizer",
    "RequestGate",
    "StatsProvider",
    "authenticate",
    "create_app",
]
