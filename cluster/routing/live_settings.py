"""Routing knobs an app's request routers take while they run: the process-local holder.

Serve builds a request router once per deployment handle, in the caller's process (the
ingress), from ``request_router_kwargs``, and a new value of those kwargs is part of the app's
code version, which restarts every replica. So ``pdserve upgrade`` of ``routing.policy`` or
``routing.hot_prefixes`` travels with the ingress's ``user_config`` instead: its
``reconfigure`` publishes them here (:func:`publish`), and each router of that app reads the
holder once per decision (:func:`current`: a dict lookup under a lock) and rebuilds its policy
when the generation moved. Keyed by app, so the routers of a stepped rollout's second app
(another app name, the new config's own kwargs) are left alone.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field

from core.config import HotPrefixConfig, RoutingConfig

LIVE_ROUTING_FIELDS = ("routing.policy", "routing.hot_prefixes")
"""Dotted config paths the routers take live."""


@dataclass(frozen=True)
class LiveRouting:
    """What a router may change between two decisions."""

    policy: str
    hot_prefixes: HotPrefixConfig = field(default_factory=HotPrefixConfig)

    @classmethod
    def of(cls, routing: RoutingConfig) -> LiveRouting:
        """The live part of a config's ``routing`` section."""
        return cls(routing.policy, routing.hot_prefixes)


@dataclass(frozen=True)
class Published:
    """One published value and its generation (higher is newer; never reused in a process)."""

    generation: int
    routing: LiveRouting


_lock = threading.Lock()
_published: dict[str, Published] = {}
_generations = itertools.count(1)


def publish(app_name: str, routing: LiveRouting) -> Published:
    """Make ``routing`` what ``app_name``'s routers in this process use from their next
    decision; publishing the value already there changes nothing."""
    with _lock:
        now = _published.get(app_name)
        if now is not None and now.routing == routing:
            return now
        _published[app_name] = Published(next(_generations), routing)
        return _published[app_name]


def current(app_name: str) -> Published | None:
    """What was published for ``app_name`` (None: nothing; its routers keep their kwargs)."""
    with _lock:
        return _published.get(app_name)


def withdraw(app_name: str) -> None:
    """Forget ``app_name``'s value (routers keep what they run; tests, a stopping ingress)."""
    with _lock:
        _published.pop(app_name, None)
