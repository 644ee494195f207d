"""Virtual models: a request's model picked by rules, and the cheap-first cascade."""

from cluster.ingress.model_routing.cascade import (
    AnswerSummary,
    escalation_reason,
    needs_logprobs,
    strip_logprobs,
    summarize_answer,
    with_logprobs,
)
from cluster.ingress.model_routing.policy import (
    DEFAULT_REASON,
    RouteDecision,
    RouteInputs,
    choose_model,
    route_inputs,
)
from cluster.ingress.model_routing.replay import as_stream_chunks

__all__ = [
    "DEFAULT_REASON",
    "AnswerSummary",
    "RouteDecision",
    "RouteInputs",
    "as_stream_chunks",
    "choose_model",
    "escalation_reason",
    "needs_logprobs",
    "route_inputs",
    "strip_logprobs",
    "summarize_answer",
    "with_logprobs",
]
