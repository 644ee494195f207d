"""The ``Ingress`` Serve deployment: the OpenAI FastAPI app wired to the pools' handles.

The app itself (routes, SSE, errors, metrics) is ``cluster.ingress.create_app``; this class
builds it inside the replica (Serve's late-bound ``@serve.ingress()`` calls
``__serve_build_asgi_app__``) from the cluster config plus handles to Prefill, Decode and the
stats board (no Prefill handle when the config has no prefill pool). On shutdown it drains:
new requests get 503 while those in flight finish.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

from cluster.config_file import load_cluster_config
from cluster.ingress import RequestGate, create_app
from cluster.ingress_settings import build_ingress_settings
from cluster.serve_clients import (
    NoPrefillPool,
    PoolWatch,
    ServeDecodeClient,
    ServePrefillClient,
)
from engine.builtin import resolve_model
from engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 30.0
"""How long a stopping ingress replica lets its requests in flight finish."""


@serve.ingress()
class IngressDeployment:
    """One ingress replica: tokenizer, admission gate, pool clients and the FastAPI app."""

    async def __init__(  # type: ignore[misc]  # Serve awaits an async constructor
        self,
        prefill: DeploymentHandle | None,
        decode: DeploymentHandle,
        board: DeploymentHandle,
        config: dict[str, Any],
    ) -> None:
        cluster_config = load_cluster_config(config)
        model_dir = resolve_model(cluster_config.model.name)
        settings = build_ingress_settings(cluster_config, model_dir)
        self._watch = PoolWatch(board)
        self._watch.start()
        self._gate = RequestGate(settings.max_in_flight_requests, settings.retry_after_s)
        self._app = create_app(
            Tokenizer.from_dir(model_dir),
            ServePrefillClient(prefill, self._watch) if prefill else NoPrefillPool(),
            ServeDecodeClient(decode, self._watch),
            settings,
            stats_provider=self._watch.stats_by_role,
            gate=self._gate,
        )

    def __serve_build_asgi_app__(self) -> FastAPI:
        """The ASGI app Serve mounts for this replica."""
        return self._app

    async def set_draining(self, draining: bool) -> bool:
        """Refuse (True) or accept again (False) new requests; returns the new state."""
        if draining:
            self._gate.start_draining()
        else:
            self._gate.stop_draining()
        return self._gate.draining

    async def __del__(self) -> None:
        """Serve calls this when the replica stops: drain, then stop watching the pools."""
        self._gate.start_draining()
        if not await self._gate.wait_idle(DRAIN_TIMEOUT_S):
            logger.warning("ingress stopped with %d requests in flight", self._gate.num_in_flight)
        self._watch.stop()
