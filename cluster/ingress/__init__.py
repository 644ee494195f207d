"""The OpenAI-compatible HTTP ingress: validation, tokenization, disaggregation, SSE, metrics."""

from cluster.ingress.dispatch.clients import DecodeClient, PrefillClient, StatsProvider
from cluster.ingress.dispatch.disagg import (
    CachedBlocksFn,
    DisaggDecision,
    DisaggPolicy,
    DisaggReason,
)
from cluster.ingress.http.admission import RequestGate, authenticate
from cluster.ingress.http.fastapi_app import IngressApp, create_app
from cluster.ingress.openai.prompts import PromptTokenizer
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
