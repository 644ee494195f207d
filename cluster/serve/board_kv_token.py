"""How a rolling upgrade's second app gets the running app's KV transfer secret: from the
running app's stats board.

The running app generates one secret when it is built (``replica.kv_token``) and binds it to
its replicas and to its :class:`~cluster.serve.stats_board.StatsBoard`. The second app's
replicas (:func:`~cluster.serve.app_builder.build_pools_app_from_config`) are built without
one: their hooks hold a :class:`BoardKVToken`, which asks that board for it while the replica
boots. The secret so never appears in the second app's args, a YAML or Serve's REST config, and
replicas of both versions that share a KV fingerprint can pull each other's KV.

Serve runs a replica's constructor on the replica's event loop, where a handle's blocking
``result()`` is refused; the question goes out on a helper thread instead, answered on Serve's
own router loop (a thread of its own unless ``RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0``, where
the wait runs out). The wait is bounded: a board that does not answer fails the boot with
``UnavailableError`` (Serve starts the replica again); a board holding no secret (the running
app uses a configured token this replica's process cannot read) fails it with ``ConfigError``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ray import serve

from cluster.serve.pool_options import BOARD_DEPLOYMENT
from core.errors import ConfigError, UnavailableError
from replica import KVToken

TOKEN_TIMEOUT_S = 30.0
"""How long a replica's boot waits for the running app's board to hand over the secret."""


@dataclass(frozen=True)
class BoardKVToken:
    """The :class:`~replica.hooks.KVTokenSource` of a pools app: the board of ``app_name``."""

    app_name: str
    timeout_s: float = TOKEN_TIMEOUT_S

    def fetch(self) -> KVToken:
        """The running app's secret (called in the replica's constructor)."""
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdserve-kv-token")
        try:
            value = pool.submit(self._ask).result(timeout=self.timeout_s)
        except ConfigError:
            raise
        except Exception as e:  # timed out, the board or its app gone, the handle refused
            raise UnavailableError(
                f"no KV transfer token from the stats board of app {self.app_name} within "
                f"{self.timeout_s:.0f}s ({type(e).__name__}: {e})"
            ) from e
        finally:
            pool.shutdown(wait=False)
        if value is None:
            raise ConfigError(
                f"app {self.app_name} generated no KV transfer token (it runs with a configured "
                "one): configure the same token for the new pools",
                param="transfer.auth_token_file",
            )
        return KVToken(value)

    def _ask(self) -> str | None:
        handle = serve.get_deployment_handle(BOARD_DEPLOYMENT, self.app_name)
        value: str | None = handle.kv_token.remote().result(timeout_s=self.timeout_s)
        return value
