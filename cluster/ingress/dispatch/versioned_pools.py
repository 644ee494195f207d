"""One model's pools spread over several Serve apps during and after stepped rollouts, seen as
one pool.

Each stepped rollout runs the new version's pools in an app of their own (``cluster.ops.
rollout``), so the ingress holds a client per app: :class:`ClientPerApp`. The request's
fingerprint (``RoutingKeys.kv_fingerprint``, chosen by :mod:`~cluster.ingress.dispatch.pairing`)
names its version; the holder picks the client of the app whose replicas run that fingerprint,
and the default app's when the fingerprint is empty or no app is known for it.
:class:`VersionedPrefillClient` and :class:`VersionedDecodeClient` are the two pool protocols
over it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Generic, Protocol, TypeVar

from cluster.ingress.dispatch.pool_clients import DecodeClient, PrefillClient
from core.messages import (
    DecodeRequest,
    PrefillRequest,
    PrefillResult,
    PrefillStarted,
    RoutingKeys,
    TokenChunk,
)

AppOfFingerprint = Callable[[str], str | None]
"""A KV fingerprint -> the Serve app whose replicas of the pool run it (None: not known)."""


class HealthReporting(Protocol):
    """What the holder needs of a pool client beyond its calls."""

    def healthy(self) -> bool:
        """Whether the pool can serve a request now."""
        ...


ClientT = TypeVar("ClientT", bound=HealthReporting)


class ClientPerApp(Generic[ClientT]):
    """One pool client per Serve app of a model, picked per request by its fingerprint."""

    def __init__(
        self, clients: Mapping[str, ClientT], default_app: str, app_of: AppOfFingerprint
    ) -> None:
        if default_app not in clients:
            raise ValueError(f"no client for the default app {default_app!r}")
        self._clients, self._app_of = dict(clients), app_of
        self._default = self._clients[default_app]

    def pick(self, routing: RoutingKeys) -> ClientT:
        """The client of the app that runs ``routing``'s fingerprint (hot path: one lookup)."""
        fingerprint = routing.kv_fingerprint
        if fingerprint:
            app = self._app_of(fingerprint)
            if app is not None:
                return self._clients.get(app, self._default)
        return self._default

    def healthy(self) -> bool:
        """True when any app's pool can serve."""
        return any(client.healthy() for client in self._clients.values())


class VersionedPrefillClient(ClientPerApp[PrefillClient]):
    """A ``PrefillClient`` over one prefill pool per app, chosen by the request's
    fingerprint."""

    async def prefill(self, request: PrefillRequest) -> PrefillResult:
        """Run the prompt on a replica of the request's version."""
        return await self.pick(request.routing).prefill(request)

    def prefill_stream(
        self, request: PrefillRequest
    ) -> AsyncIterator[PrefillStarted | PrefillResult]:
        """The pipelined prefill on a replica of the request's version."""
        return self.pick(request.routing).prefill_stream(request)


class VersionedDecodeClient(ClientPerApp[DecodeClient]):
    """A ``DecodeClient`` over one decode pool per app, chosen by the request's fingerprint."""

    def generate(self, request: DecodeRequest) -> AsyncIterator[TokenChunk]:
        """Stream the request's tokens from a replica of its version."""
        return self.pick(request.routing).generate(request)
