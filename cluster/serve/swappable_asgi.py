"""An ASGI app that forwards to another one that can be replaced while it serves.

Serve asks an ingress replica for its ASGI app once (``__serve_build_asgi_app__``); the ingress
hands it a :class:`SwappableAsgi` so that an in-place reconfigure can put a rebuilt app behind
it. A request already inside the old app finishes there; the next one reaches the new.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class SwappableAsgi:
    """Forwards every ASGI call to :attr:`current`."""

    def __init__(self, app: ASGIApp) -> None:
        self.current = app

    def swap(self, app: ASGIApp) -> None:
        """Send the next calls to ``app``."""
        self.current = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One ASGI call, handled by the app current when it starts."""
        await self.current(scope, receive, send)
