"""The OpenAI-compatible HTTP ingress: validation, tokenization, disaggregation, SSE, metrics."""

from cluster.ingress.admission import RequestGate, authenticate
from cluster.ingress.app import create_app
from cluster.ingress.clients import DecodeClient, PrefillClient, StatsProvider
from cluster.ingress.disagg import CachedBlocksFn, DisaggDecision, DisaggPolicy, DisaggReason
from cluster.ingress.prompts import PromptTokenizer
from cluster.ingress.settings import IngressSettings

__all__ = [
    "CachedBlocksFn",
    "DecodeClient",
    "DisaggDecision",
    "DisaggPolicy",
    "DisaggReason",
    "IngressSettings",
    "PrefillClient",
    "PromptTokenizer",
    "RequestGate",
    "StatsProvider",
    "authenticate",
    "create_app",
]
