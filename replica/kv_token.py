"""The per-cluster KV transfer secret: generated at deploy when no token is configured.

The KV data plane must never accept unauthenticated pulls on a routable address. An operator may
configure a shared token (``transfer.auth_token_file`` or the ``transfer.auth_token_env``
variable on every node); when the deploying process finds none, the application generates one
secret for the cluster and hands it to every prefill and decode replica as a constructor
argument. Each replica puts it into its own process environment under the configured variable
name, where the transfer layer's token lookup finds it. It is never written into YAML, config
dumps or logs: its ``repr`` is redacted, and a configured token always wins.

A rolling upgrade's second app generates none: its replicas join the running app's secret,
fetched at boot through a :class:`~replica.hooks.KVTokenSource`, so the two versions' replicas
may pull each other's KV.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field

from core.config import TransferConfig
from core.errors import ConfigError
from transfer.security import resolve_auth_token

DEFAULT_TOKEN_ENV = "PDSERVE_KV_TOKEN"
"""The variable a generated secret goes into when the config names none."""


@dataclass(frozen=True)
class KVToken:
    """A generated KV transfer secret; :meth:`install` makes a replica use it."""

    value: str = field(repr=False)

    @classmethod
    def generate(cls) -> KVToken:
        """A fresh 256-bit secret."""
        return cls(secrets.token_urlsafe(32))

    @classmethod
    def for_deploy(cls, config: TransferConfig) -> KVToken | None:
        """A fresh secret unless ``config`` already yields a token in this process."""
        return None if is_configured(config) else cls.generate()

    def install(self, config: TransferConfig) -> TransferConfig:
        """``config`` for this replica: a configured token is kept; otherwise this secret goes
        into the process environment under ``auth_token_env`` (default ``PDSERVE_KV_TOKEN``)."""
        if is_configured(config):
            return config
        env_name = config.auth_token_env or DEFAULT_TOKEN_ENV
        os.environ[env_name] = self.value
        return config.model_copy(update={"auth_token_env": env_name})


def is_configured(config: TransferConfig) -> bool:
    """Whether ``config`` yields a token in this process (a configured token wins over a
    generated one; ``require_auth`` without a token is not an error here: a generated one
    satisfies it)."""
    try:
        return resolve_auth_token(config) is not None
    except ConfigError:
        return False
