"""The models one ingress serves: each one's tokenizer, flow and metrics, found by name.

``create_app`` gets a :class:`ModelEndpoint` per served model (its tokenizer, its two pool
clients, its settings) and builds a :class:`ServedRoute` for each: the tokenizer (the protocol
handlers build their prompts with it), the disaggregation policy and the
:class:`GenerationFlow` over that model's pools, and the ingress metrics labelled with its name.
:class:`ModelTable` finds the route a request's ``model`` names (the first model when it names
none), knows the virtual names (``auto``) the YAML declares, and answers a name it does not
know with the OpenAI 404 that lists what it serves. Its LoRA adapters follow the cluster's
registry (:meth:`ModelTable.sync` before a lookup, ``cluster.ingress.lora_adapters``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cluster.ingress.dispatch.disagg import CachedBlocksFn, DisaggPolicy
from cluster.ingress.dispatch.flow import GenerationFlow
from cluster.ingress.dispatch.pairing import FleetVersions
from cluster.ingress.dispatch.pool_clients import DecodeClient, PrefillClient
from cluster.ingress.lora_adapters import AdapterRegistry, ServedAdapters
from cluster.ingress.prompt_tokenizer import PromptTokenizer
from cluster.ingress.settings import IngressSettings
from cluster.ingress.telemetry.request_metrics import IngressMetrics
from core.config import VirtualModelConfig
from core.errors import ModelNotFoundError
from engine.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass(frozen=True)
class ModelEndpoint:
    """What the ingress is handed for one served model."""

    tokenizer: PromptTokenizer
    prefill: PrefillClient
    decode: DecodeClient
    settings: IngressSettings
    cached_blocks_fn: CachedBlocksFn | None = None
    """How many of a prompt's blocks this model's decode pool caches (None: not known)."""
    versions: FleetVersions | None = None
    """The pools' live replicas by KV fingerprint, to pair prefill and decode by (None: any)."""


@dataclass(frozen=True)
class ModelHealth:
    """What ``/health`` and ``/ready`` report of one model."""

    prefill: bool
    """A remote prefill may be tried now (see ``GenerationFlow.prefill_available``)."""
    decode: bool
    """A decode replica reports to the stats board."""
    degraded: bool
    """Its prefill pool is required but unavailable: every prompt prefills on decode."""
    ready: bool
    """A request sent now would be served."""
    reason: str
    """Why, in words: what serves this model now, or what is missing."""


@dataclass(frozen=True)
class ServedRoute:
    """One served model inside the ingress."""

    settings: IngressSettings
    tokenizer: PromptTokenizer
    flow: GenerationFlow
    metrics: IngressMetrics
    """The app's metrics, labelled ``model_name`` = this model."""

    @property
    def name(self) -> str:
        """The model's canonical served name."""
        return self.settings.model_name

    def health(self) -> ModelHealth:
        """This model's health now (with local fallback, decode alone serves every prompt)."""
        prefill, decode = self.flow.prefill_available(), self.flow.decode.healthy()
        degraded = self.settings.prefill_required and not prefill
        fallback = self.settings.disaggregation.fallback_to_local_prefill
        serves = not degraded or fallback
        if not decode:
            reason = "no decode replica is serving"
        elif prefill:
            reason = "prefill and decode replicas are serving"
        elif degraded and not fallback:
            reason = "no prefill replica is serving and local prefill is off"
        elif degraded:
            reason = "decode serves alone: no prefill replica is serving, prompts prefill on decode"
        else:
            reason = "decode serves alone: no prefill replica is running (colocated or scaled to 0)"
        return ModelHealth(prefill, decode, degraded, serves and decode, reason)


def build_route(endpoint: ModelEndpoint, metrics: IngressMetrics) -> ServedRoute:
    """The route of one model over the app's ``metrics``."""
    settings, tokenizer = endpoint.settings, endpoint.tokenizer
    labelled = metrics.for_model(settings.model_name)
    policy = DisaggPolicy(
        settings.disaggregation.local_prefill_threshold_tokens,
        settings.block_size,
        endpoint.cached_blocks_fn,
    )
    detokenizer = None
    if isinstance(tokenizer, Tokenizer):

        def detokenizer(prompt_ids: list[int]) -> IncrementalDetokenizer:
            return IncrementalDetokenizer(tokenizer, prompt_token_ids=prompt_ids)

    flow = GenerationFlow(
        endpoint.prefill,
        endpoint.decode,
        policy,
        settings,
        labelled,
        detokenizer,
        endpoint.versions,
    )
    return ServedRoute(settings, tokenizer, flow, labelled)


class ModelTable:
    """Served models by every name a client may send, plus the virtual names."""

    def __init__(
        self,
        routes: Sequence[ServedRoute],
        virtual: Sequence[VirtualModelConfig] = (),
        registry: AdapterRegistry | None = None,
    ) -> None:
        if not routes:
            raise ValueError("an ingress serves at least one model")
        self.routes = tuple(routes)
        self._by_name: dict[str, ServedRoute] = {}
        for route in self.routes:
            for name in route.settings.served_model_names:
                self._by_name.setdefault(name, route)
        self.virtual = {v.name: v for v in virtual}
        self.adapters = ServedAdapters.of_models(
            ((route.name, route.settings.lora_modules) for route in self.routes), registry
        )
        """The LoRA adapters served on these models (a request names one as ``model``): the
        YAML's, and ``registry``'s loaded at run time."""

    @property
    def default(self) -> ServedRoute:
        """The first model: what a request that names no model gets."""
        return self.routes[0]

    async def sync(self, name: str | None) -> None:
        """Bring the adapters up to date before ``name`` is looked up: a served or virtual
        name (or none) costs nothing; any other may name an adapter loaded or unloaded through
        another ingress (``ServedAdapters.sync``)."""
        if name is None or name in self._by_name or name in self.virtual:
            return
        await self.adapters.sync(name)

    def served(self, name: str) -> ServedRoute | None:
        """The served model ``name`` names (any of its served names; None: no model)."""
        return self._by_name.get(name)

    def find(self, name: str | None) -> ServedRoute:
        """The route ``name`` picks (None: the default); a virtual name picks its default
        model here (the generation endpoints route it by its rules instead)."""
        if name is None:
            return self.default
        route = self._by_name.get(name)
        if route is not None:
            return route
        adapter = self.adapters.find(name)
        if adapter is not None:
            return self._by_name[adapter.base]
        virtual = self.virtual.get(name)
        if virtual is not None:
            return self._by_name[virtual.default]
        served = [*self.names(), *(a.name for a in self.adapters.all())]
        raise ModelNotFoundError(
            f"the model {name!r} does not exist; this server serves: {', '.join(served)}",
            param="model",
        )

    def names(self) -> list[str]:
        """Every served and virtual name, served ones first."""
        return [*self._by_name, *self.virtual]

    def max_model_len(self, name: str) -> int:
        """``max_model_len`` of what ``name`` serves (a virtual name: the least of its
        models', since any of them may answer)."""
        virtual = self.virtual.get(name)
        if virtual is None:
            return self.find(name).settings.max_model_len
        return min(self._by_name[model].settings.max_model_len for _, model in virtual.models())
