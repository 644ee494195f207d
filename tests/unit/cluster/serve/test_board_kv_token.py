"""One KV secret per cluster across a rolling upgrade's two apps: the running app binds its
generated secret to its replicas and its stats board; the second app's replicas carry none and
fetch the board's at boot (a configured token wins, and then the board holds none). The fetch
never blocks the replica's event loop, and a board that does not answer or holds no secret fails
the boot with a typed error."""

from __future__ import annotations

import asyncio
import pickle
import threading
from typing import Any

import pytest
from ray.serve import Application

from cluster.serve import board_kv_token
from cluster.serve.app_builder import build_app_from_config, build_pools_app
from cluster.serve.board_kv_token import BoardKVToken
from cluster.serve.config_file import load_cluster_config
from cluster.serve.stats_board import StatsBoard
from core.codec import from_plain
from core.errors import ConfigError, UnavailableError
from replica import KVToken, ReplicaHooks, ReplicaSpec

pytestmark = pytest.mark.timeout(30)

CONFIG: dict[str, Any] = {
    "model": {"name": "builtin:tiny-moe"},
    "prefill": {"num_replicas": 1},
    "decode": {"num_replicas": 2},
    "cluster": {"app_name": "pdserve"},
}


def bound_pools(app: Application, pools_arg: int = 0) -> list[tuple[ReplicaSpec, ReplicaHooks]]:
    """Each pool's bound spec and hooks (the ingress's or the rollout root's first arg)."""
    (prefill, decode) = next(iter(app._bound_deployment.init_args[pools_arg].values()))
    return [
        (
            from_plain(ReplicaSpec, pool._bound_deployment.init_args[0]),
            pool._bound_deployment.init_args[1],
        )
        for pool in (prefill, decode)
    ]


def test_the_running_app_binds_one_secret_to_its_replicas_and_its_board() -> None:
    app = build_app_from_config(load_cluster_config(CONFIG))
    board = app._bound_deployment.init_args[1]._bound_deployment
    token = board.init_kwargs["kv_token"]
    assert isinstance(token, KVToken)
    for spec, hooks in bound_pools(app):
        assert spec.kv_token == token and hooks.kv_token is None


def test_the_pools_app_carries_no_secret_and_fetches_the_running_apps() -> None:
    app = build_pools_app({"config": CONFIG})
    for spec, hooks in bound_pools(app):
        assert spec.kv_token is None
        assert hooks.kv_token == BoardKVToken("pdserve")
    running = build_app_from_config(load_cluster_config(CONFIG))
    secret = running._bound_deployment.init_args[1]._bound_deployment.init_kwargs["kv_token"]
    assert secret.value.encode() not in pickle.dumps(app._bound_deployment.init_args)


def test_a_configured_token_leaves_the_board_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDSERVE_TEST_CONFIGURED_TOKEN", "configured")
    config = {**CONFIG, "transfer": {"auth_token_env": "PDSERVE_TEST_CONFIGURED_TOKEN"}}
    app = build_app_from_config(load_cluster_config(config))
    assert app._bound_deployment.init_args[1]._bound_deployment.init_kwargs["kv_token"] is None
    assert all(spec.kv_token is None for spec, _ in bound_pools(app))
    assert StatsBoard().kv_token() is None


def test_the_board_hands_its_secret_over_and_never_shows_it() -> None:
    token = KVToken.generate()
    board = StatsBoard(kv_token=token)
    assert board.kv_token() == token.value
    assert token.value not in repr(token) and token.value not in repr(board.view())


class Reply:
    def __init__(self, value: str | None, release: threading.Event | None) -> None:
        self.value, self.release = value, release

    def result(self, timeout_s: float) -> str | None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:  # Serve refuses this on a running loop; the constructor runs on one
            raise RuntimeError("sync result() called from within an asyncio event loop")
        if self.release is not None:
            self.release.wait(timeout_s)
            raise TimeoutError("no answer")
        return self.value


class Handle:
    def __init__(self, value: str | None, release: threading.Event | None = None) -> None:
        self.value, self.release = value, release
        self.kv_token = self

    def remote(self) -> Reply:
        return Reply(self.value, self.release)


def patch_handle(monkeypatch: pytest.MonkeyPatch, handle: Handle) -> list[tuple[str, str]]:
    asked: list[tuple[str, str]] = []

    def get_handle(deployment: str, app: str) -> Handle:
        asked.append((deployment, app))
        return handle

    monkeypatch.setattr(board_kv_token.serve, "get_deployment_handle", get_handle)
    return asked


def test_the_fetch_from_a_constructor_on_an_event_loop_gets_the_boards_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = patch_handle(monkeypatch, Handle("the-secret"))

    async def constructor() -> KVToken:
        return BoardKVToken("pdserve").fetch()

    assert asyncio.run(constructor()) == KVToken("the-secret")
    assert asked == [("StatsBoard", "pdserve")]


def test_a_board_that_does_not_answer_fails_the_boot_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()
    patch_handle(monkeypatch, Handle("late", release))
    try:
        with pytest.raises(UnavailableError, match="no KV transfer token from the stats board"):
            BoardKVToken("pdserve", timeout_s=0.2).fetch()
    finally:
        release.set()


def test_a_board_without_a_secret_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    patch_handle(monkeypatch, Handle(None))
    with pytest.raises(ConfigError, match="configure the same token"):
        BoardKVToken("pdserve").fetch()
