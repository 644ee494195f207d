"""A model's pools over several Serve apps during and after stepped rollouts: each request goes
to the app whose replicas run its fingerprint, to the default app's when it names none or an
unknown one (whichever app that is, for any number of apps); a replica's app is read from its
Serve actor name."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cluster.ingress.dispatch.versioned_pools import (
    ClientPerApp,
    VersionedDecodeClient,
    VersionedPrefillClient,
)
from cluster.routing.routed_replicas import deployment_of
from core.messages import DecodeRequest, PrefillRequest, RoutingKeys

pytestmark = pytest.mark.timeout(10)

APPS = {"fp-old": "pdserve", "fp-new": "pdserve-next"}


class Recording:
    """Both client protocols: records the requests it was handed, healthy as told."""

    def __init__(self, healthy: bool = True) -> None:
        self.requests: list[Any] = []
        self._healthy = healthy

    async def prefill(self, request: Any) -> Any:
        self.requests.append(request)
        return request

    async def prefill_stream(self, request: Any) -> AsyncIterator[Any]:
        self.requests.append(request)
        yield request

    async def generate(self, request: Any) -> AsyncIterator[Any]:
        self.requests.append(request)
        yield request

    def healthy(self) -> bool:
        return self._healthy


def keys(fingerprint: str) -> RoutingKeys:
    return RoutingKeys(kv_fingerprint=fingerprint)


def routed_request(cls: type, fingerprint: str) -> Any:
    """A request of ``cls`` carrying only the routing keys the clients read."""
    request: Any = object.__new__(cls)
    object.__setattr__(request, "routing", keys(fingerprint))
    return request


@pytest.mark.parametrize(
    ("fingerprint", "app"),
    [("fp-new", "pdserve-next"), ("fp-old", "pdserve"), ("", "pdserve"), ("fp-gone", "pdserve")],
)
def test_a_request_goes_to_the_app_of_its_fingerprint(fingerprint: str, app: str) -> None:
    prefills = {"pdserve": Recording(), "pdserve-next": Recording()}
    decodes = {"pdserve": Recording(), "pdserve-next": Recording()}
    prefill = VersionedPrefillClient(prefills, "pdserve", APPS.get)
    decode = VersionedDecodeClient(decodes, "pdserve", APPS.get)
    p_request = routed_request(PrefillRequest, fingerprint)
    d_request = routed_request(DecodeRequest, fingerprint)

    async def drive() -> None:
        await prefill.prefill(p_request)
        async for _ in prefill.prefill_stream(p_request):
            pass
        async for _ in decode.generate(d_request):
            pass

    asyncio.run(asyncio.wait_for(drive(), timeout=5))
    for name, client in prefills.items():
        assert len(client.requests) == (2 if name == app else 0)
        assert len(decodes[name].requests) == (1 if name == app else 0)


def test_healthy_while_any_app_can_serve() -> None:
    both = {"pdserve": Recording(healthy=False), "pdserve-next": Recording()}
    assert VersionedDecodeClient(both, "pdserve", APPS.get).healthy()
    none = {"pdserve": Recording(healthy=False)}
    assert not VersionedPrefillClient(none, "pdserve", APPS.get).healthy()


def test_the_default_app_needs_a_client() -> None:
    with pytest.raises(ValueError, match="default app 'pdserve'"):
        VersionedDecodeClient({"pdserve-next": Recording()}, "pdserve", APPS.get)


THREE = {"fp-1": "pdserve-rollout", "fp-2": "pdserve-rollout-2", "fp-0": "pdserve"}


@pytest.mark.parametrize(
    ("fingerprint", "app"),
    [("fp-2", "pdserve-rollout-2"), ("fp-1", "pdserve-rollout"), ("fp-0", "pdserve"),
     ("", "pdserve-rollout"), ("fp-gone", "pdserve-rollout")],
)  # fmt: skip
def test_a_second_rollout_picks_among_three_apps(fingerprint: str, app: str) -> None:
    """The running app's pools (at 0 after the first rollout) and two rollouts' apps; the one
    serving before this rollout is the default."""
    clients = {name: Recording() for name in ("pdserve", "pdserve-rollout", "pdserve-rollout-2")}
    holder = ClientPerApp(clients, "pdserve-rollout", THREE.get)
    assert holder.pick(keys(fingerprint)) is clients[app]


def test_an_app_the_holder_has_no_client_for_falls_back_to_the_default() -> None:
    clients = {"pdserve-rollout": Recording()}
    holder = ClientPerApp(clients, "pdserve-rollout", THREE.get)
    assert holder.pick(keys("fp-2")) is clients["pdserve-rollout"]


@pytest.mark.parametrize(
    ("actor_name", "app"),
    [
        ("SERVE_REPLICA::pdserve-next#Decode#abc123", "pdserve-next"),
        ("SERVE_REPLICA::Decode#abc123", None),
        ("SERVE_CONTROLLER_ACTOR", None),
        ("", None),
    ],
)
def test_the_app_of_a_replica_comes_from_its_actor_name(actor_name: str, app: str | None) -> None:
    deployment = deployment_of(actor_name)
    assert (None if deployment is None else deployment[0]) == app
