"""One model's pools spread over two Serve apps during a stepped rollout, seen as one pool.

The new version's pools run in an app of their own (``cluster.ops.rollout``), so the ingress
holds a client per app. The request's fingerprint (``RoutingKeys.kv_fingerprint``, chosen by
:mod:`~cluster.ingress.dispatch.pairing`) names its version; :class:`VersionedPrefillClient`
and :class:`VersionedDecodeClient` send it to the app whose replicas run that fingerprint, and
to the running app's pools when the fingerprint is empty or no app is known for it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping

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


def _app_for(routing: RoutingKeys, home_app: str, app_of: AppOfFingerprint) -> str:
    if not routing.kv_fingerprint:
        return home_app
    return app_of(routing.kv_fingerprint) or home_app


class VersionedPrefillClient:
    """A ``PrefillClient`` over one prefill pool per app, chosen by the request's
    fingerprint."""

    def __init__(
        self, clients: Mapping[str, PrefillClient], home_app: str, app_of: AppOfFingerprint
    ) -> None:
        if home_app not in clients:
            raise ValueError(f"no prefill client for the running app {home_app!r}")
        self._clients, self._home, self._app_of = dict(clients), home_app, app_of

    def _client(self, request: PrefillRequest) -> PrefillClient:
        app = _app_for(request.routing, self._home, self._app_of)
        return self._clients.get(app, self._clients[self._home])

    async def prefill(self, request: PrefillRequest) -> PrefillResult:
        """Run the prompt on a replica of the request's version."""
        return await self._client(request).prefill(request)

    def prefill_stream(
        self, request: PrefillRequest
    ) -> AsyncIterator[PrefillStarted | PrefillResult]:
        """The pipelined prefill on a replica of the request's version."""
        return self._client(request).prefill_stream(request)

    def healthy(self) -> bool:
        """True when any app's prefill pool can serve."""
        return any(client.healthy() for client in self._clients.values())


class VersionedDecodeClient:
    """A ``DecodeClient`` over one decode pool per app, chosen by the request's fingerprint."""

    def __init__(
        self, clients: Mapping[str, DecodeClient], home_app: str, app_of: AppOfFingerprint
    ) -> None:
        if home_app not in clients:
            raise ValueError(f"no decode client for the running app {home_app!r}")
        self._clients, self._home, self._app_of = dict(clients), home_app, app_of

    def generate(self, request: DecodeRequest) -> AsyncIterator[TokenChunk]:
        """Stream the request's tokens from a replica of its version."""
        app = _app_for(request.routing, self._home, self._app_of)
        return self._clients.get(app, self._clients[self._home]).generate(request)

    def healthy(self) -> bool:
        """True when any app's decode pool can serve."""
        return any(client.healthy() for client in self._clients.values())


def app_of_actor(actor_name: str) -> str | None:
    """The Serve app of a replica from its actor name (``SERVE_REPLICA::<app>#<deployment>#<id>``,
    as a stats board report carries it); None for a name without one."""
    prefix = "SERVE_REPLICA::"
    if not actor_name.startswith(prefix):
        return None
    parts = actor_name[len(prefix) :].split("#")
    return parts[0] or None if len(parts) == 3 else None  # no app: ``<deployment>#<id>``
