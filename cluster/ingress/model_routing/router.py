"""Which served model answers a request: its ``model`` field, or a virtual name's rules.

:meth:`ModelRouter.pick` resolves a parsed request body to a :class:`ModelPick`: the served
model's route and the body to run there (``model`` replaced by the real name, so the response
names the model that answered). A virtual name (``auto``) goes through its rules
(:func:`choose_model`, prompt lengths counted with the virtual model's default tokenizer); a
request that no rule claimed carries the virtual model's cascade, which the handlers run.
:meth:`ModelRouter.count` records the final decision once per request, by model and reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from cluster.ingress.model_routing.policy import choose_model, route_inputs
from cluster.ingress.model_table import ModelTable, ServedRoute
from cluster.ingress.telemetry.request_metrics import IngressMetrics
from core.config import CascadeConfig
from core.config.virtual_models import NAMED_REASON
from core.errors import InvalidRequestError

ROUTED_MODEL_HEADER = "x-pdserve-routed-model"
ROUTE_REASON_HEADER = "x-pdserve-route-reason"
CASCADE_USAGE_HEADER = "x-pdserve-cascade-usage"
"""On an escalated answer: the tokens the first model spent before it was escalated."""


@dataclass(frozen=True)
class ModelPick:
    """Where one request goes."""

    route: ServedRoute
    data: dict[str, Any]
    """The request body to run on ``route`` (``model`` set to its served name)."""
    virtual: str | None = None
    """The virtual name the client sent (None: it named a served model)."""
    reason: str = NAMED_REASON
    cascade: CascadeConfig | None = None
    """Run the cascade: answer with ``route`` first, escalate on its checks."""

    def headers(self) -> dict[str, str]:
        """The response headers that say where a virtual request went and why."""
        if self.virtual is None:
            return {}
        return {ROUTED_MODEL_HEADER: self.route.name, ROUTE_REASON_HEADER: self.reason}

    def moved_to(self, route: ServedRoute, reason: str) -> ModelPick:
        """This request answered by ``route`` instead, for ``reason``."""
        data = {**self.data, "model": route.name}
        return replace(self, route=route, data=data, reason=reason, cascade=None)


class ModelRouter:
    """Resolves requests to served models and counts virtual-model decisions."""

    def __init__(self, table: ModelTable, metrics: IngressMetrics) -> None:
        self.table = table
        self._metrics = metrics

    def pick(self, data: Mapping[str, Any], headers: Mapping[str, str], *, chat: bool) -> ModelPick:
        """The model ``data`` (a parsed request body) goes to; ``ModelNotFoundError`` for a
        name nobody serves."""
        name = data.get("model")
        if name is not None and not isinstance(name, str):
            raise InvalidRequestError("model must be a string", param="model")
        virtual = self.table.virtual.get(name) if name is not None else None
        if virtual is None:
            route = self.table.find(name)
            return ModelPick(route, dict(data))
        default = self.table.find(virtual.default)
        inputs = route_inputs(
            data,
            {k.lower(): v for k, v in headers.items()},
            chat=chat,
            count_tokens=lambda text: len(default.tokenizer.encode(text)),
        )
        decision = choose_model(virtual, inputs)
        route = self.table.find(decision.model)
        body = {**data, "model": route.name}
        # NOTE: an echo answer starts with the prompt (its text and logprobs), which the
        # cascade's checks would read as the model's; such requests stay on the first pick.
        cascade = None if data.get("echo") else decision.cascade
        return ModelPick(route, body, virtual.name, decision.reason, cascade)

    def count(self, pick: ModelPick) -> None:
        """Record the final decision of a request to a virtual model."""
        if pick.virtual is not None:
            self._metrics.model_routes.labels(pick.virtual, pick.route.name, pick.reason).inc()
