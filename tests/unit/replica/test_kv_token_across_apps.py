"""One KV secret across a rolling upgrade's two apps: an old-app prefill (the secret bound at
build) and a new-app decode that fetched it from the running app's stats board at boot complete
a real KV pull over gRPC; a decode with a secret of its own (what the second app had before) is
refused. A replica fetches first, keeps a configured token, and a failed fetch starts nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from cluster.serve import board_kv_token
from cluster.serve.board_kv_token import BoardKVToken
from cluster.serve.stats_board import StatsBoard
from core.config import TransferConfig
from core.errors import UnavailableError
from core.ids import new_request_id
from core.kv_handle import TransferFailure
from decode.deployment import DecodeDeployment
from decode.worker import DecodeWorker
from prefill.deployment import PrefillDeployment
from replica import KVToken, ReplicaHooks, ReplicaSpec
from replica.lifecycle import joined_token
from tests.unit.decode.helpers import Handoff, handoff
from tests.unit.engine.async_engine.tiny_engine import ENGINE, GREEDY, MODEL, PROMPTS
from transfer import GrpcKVTransport

pytestmark = pytest.mark.timeout(90)

OLD_ENV, NEW_ENV = "PDSERVE_TEST_OLD_APP_TOKEN", "PDSERVE_TEST_NEW_APP_TOKEN"
"""Each replica installs its secret under its own variable: one process holds both."""


class Reply:
    def __init__(self, value: str | None) -> None:
        self.value = value

    def result(self, timeout_s: float) -> str | None:
        assert_no_running_loop()
        return self.value


def assert_no_running_loop() -> None:
    """Serve refuses a blocking ``result()`` on a running event loop (a constructor's)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise AssertionError("a blocking handle call on the replica's event loop")


class BoardHandle:
    """``serve.get_deployment_handle(StatsBoard, app)`` over a local board."""

    def __init__(self, board: StatsBoard) -> None:
        self.board = board
        self.kv_token = self

    def remote(self) -> Reply:
        return Reply(self.board.kv_token())


@pytest.fixture
def running_board(monkeypatch: pytest.MonkeyPatch) -> Iterator[StatsBoard]:
    """The running app's board, holding the secret its builder generated."""
    board = StatsBoard(kv_token=KVToken.generate())
    asked: list[str] = []

    def get_handle(deployment: str, app: str) -> BoardHandle:
        asked.append(f"{app}/{deployment}")
        return BoardHandle(board)

    monkeypatch.setattr(board_kv_token.serve, "get_deployment_handle", get_handle)
    for name in (OLD_ENV, NEW_ENV):
        monkeypatch.delenv(name, raising=False)
    yield board
    assert set(asked) <= {"pdserve/StatsBoard"}


def spec(role: str, env: str, token: KVToken | None, **engine: Any) -> ReplicaSpec:
    transfer = TransferConfig(
        bind_host="127.0.0.1",
        auth_token_env=env,
        same_node="off",
        pull_deadline_s=10.0,
        lease_s=2.0,  # the refused pull's export is freed by its lease: the stop waits for it
    )
    return ReplicaSpec(
        role=role,  # type: ignore[arg-type]
        model=MODEL,
        engine=ENGINE.model_copy(update=engine),
        transfer=transfer,
        kv_failure_policy="fail",  # a refused pull fails the request: no silent recompute
        kv_token=token,
    )


def run_handoff(prefill: PrefillDeployment, decode: DecodeWorker) -> Handoff:
    prompt = PROMPTS["len70"]
    return asyncio.run(handoff(prefill.worker, decode, new_request_id(), prompt, GREEDY))


def stop(*replicas: PrefillDeployment | DecodeDeployment) -> None:
    for replica in replicas:
        stopping = replica.__del__()
        assert stopping is not None
        asyncio.run(stopping)


def test_a_new_app_decode_pulls_from_an_old_app_prefill_with_the_boards_secret(
    running_board: StatsBoard,
) -> None:
    secret = running_board._kv_token
    old_prefill = PrefillDeployment(spec("prefill", OLD_ENV, secret))
    new_spec = spec("decode", NEW_ENV, None, max_num_seqs=ENGINE.max_num_seqs // 2)

    async def boot_on_a_loop() -> DecodeDeployment:  # as Serve runs a constructor
        return DecodeDeployment(new_spec, ReplicaHooks(kv_token=BoardKVToken("pdserve")))

    new_decode = asyncio.run(boot_on_a_loop())
    own_secret = own_secret_importer(new_decode)
    try:
        old_fp = old_prefill.replica_stats().kv_fingerprint
        assert old_fp == new_decode.replica_stats().kv_fingerprint  # pull allowed by version
        got = run_handoff(old_prefill, new_decode.worker)
        assert all(chunk.error is None for chunk in got.chunks), got.chunks
        assert len(got.token_ids) == GREEDY.max_tokens
        assert new_decode.replica_stats().transfer.failures_total == 0

        worker = DecodeWorker(new_decode.worker.engine, own_secret, kv_failure_policy="fail")
        refused = run_handoff(old_prefill, worker)
        error = refused.chunks[-1].error
        assert error is not None and error.reason == TransferFailure.UNAUTHENTICATED, error
    finally:
        own_secret.close()
        stop(old_prefill, new_decode)


def own_secret_importer(decode: DecodeDeployment) -> GrpcKVTransport:
    """An importer over the decode's KV pulling with a secret of its own (what the second
    app's replicas had before)."""
    transfer = decode.spec.transfer.model_copy(
        update={"insecure_test_token": KVToken.generate().value}
    )
    storage = decode.worker.engine.engine.parts.storage
    return GrpcKVTransport(storage, transfer, serve=False, kv_compat=decode.worker.kv_compat)


class Source:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.calls = 0

    def fetch(self) -> KVToken:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return KVToken("from-the-board")


def test_a_configured_token_wins_over_the_boards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NEW_ENV, "configured")
    source = Source()
    unchanged = spec("decode", NEW_ENV, None)
    assert joined_token(unchanged, source) is unchanged and source.calls == 0
    monkeypatch.delenv(NEW_ENV)
    joined = joined_token(unchanged, source)
    assert joined.kv_token == KVToken("from-the-board") and source.calls == 1
    assert "from-the-board" not in repr(joined)
    assert joined_token(unchanged, None) is unchanged


class Publisher:
    def __init__(self) -> None:
        self.started = False

    def start(self, replica_id: str, app_name: str) -> Publisher:
        self.started = True
        return self


def test_a_replica_that_cannot_get_the_secret_fails_before_starting_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(NEW_ENV, raising=False)
    publisher = Publisher()
    hooks = ReplicaHooks(
        kv_events=publisher,  # type: ignore[arg-type]
        kv_token=Source(UnavailableError("no KV transfer token from the stats board")),
    )
    with pytest.raises(UnavailableError, match="no KV transfer token"):
        DecodeDeployment(spec("decode", NEW_ENV, None), hooks)
    assert not publisher.started
