"""``POST /admin/faults``: absent unless configured; a kill or a transfer fault reaches the
cluster's admin; a bad body is a 400 naming its field; the board hands a role its faults with
its report answers until they expire."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI

from cluster.ingress.app.fault_routes import FAULTS_ROUTE, add_fault_routes
from cluster.serve.stats_board import BoardReply, StatsBoard
from core.codec import from_plain
from core.errors import UnavailableError
from core.transfer_faults import FaultInjection
from tests.unit.cluster.ingress.fakes import run
from tests.waiting import wait_until


class FakeAdmin:
    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    async def kill_replica(self, pool: str) -> str:
        if pool == "prefill":
            raise UnavailableError("no live prefill replica to kill")
        self.calls.append(("kill", pool))
        return f"killed {pool} replica r1"

    async def transfer_faults(self, fail: bool, stall_per_chunk_s: float, duration_s: float) -> str:
        self.calls.append(("transfer", fail, stall_per_chunk_s, duration_s))
        return "set"

    async def clear_transfer_faults(self) -> str:
        self.calls.append(("clear",))
        return "cleared"


async def post(app: FastAPI, body: object) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.post(FAULTS_ROUTE, json=body)


def test_the_route_is_absent_unless_configured() -> None:
    app = FastAPI()
    add_fault_routes(app, None)
    assert run(post(app, {"action": "kill_replica", "pool": "decode"})).status_code == 404


def test_faults_reach_the_admin_and_bad_bodies_are_named() -> None:
    app, admin = FastAPI(), FakeAdmin()
    add_fault_routes(app, admin)
    killed = run(post(app, {"action": "kill_replica", "pool": "decode"}))
    assert killed.status_code == 200
    assert killed.json() == {"action": "kill_replica", "detail": "killed decode replica r1"}
    stall = {"action": "transfer_stall", "duration_s": 3, "stall_per_chunk_s": 0.25}
    assert run(post(app, stall)).status_code == 200
    assert run(post(app, {"action": "transfer_clear"})).json()["detail"] == "cleared"
    assert admin.calls == [("kill", "decode"), ("transfer", False, 0.25, 3.0), ("clear",)]
    for body, param in [
        ({"action": "kill_replica"}, None),
        ({"action": "explode"}, "action"),
        ({"action": "transfer_fail", "duration_s": -1}, "duration_s"),
        ({"action": "transfer_fail", "bogus": 1}, "bogus"),
    ]:
        response = run(post(app, body))
        assert response.status_code == 400, body
        assert response.json()["error"]["param"] == param, response.json()
    missing = run(post(app, {"action": "kill_replica", "pool": "prefill"}))
    assert missing.status_code == 503 and "no live prefill" in missing.json()["error"]["message"]


def test_the_board_answers_faults_until_they_expire() -> None:
    board = StatsBoard()
    report = {"replica_id": "p1", "role": "prefill"}

    def faults(replica: dict[str, Any]) -> FaultInjection | None:
        return from_plain(BoardReply, board.report(replica)).faults

    assert faults(report) is None
    board.set_faults("prefill", {"fail_after_chunks": 0}, duration_s=0.2)
    assert faults(report) == FaultInjection(fail_after_chunks=0)
    assert faults({"replica_id": "d1", "role": "decode"}) is None  # another role
    wait_until(lambda: faults(report) is None, 5, "the faults expire")


def test_a_reply_of_an_earlier_board_is_read_as_its_faults() -> None:
    """A rolling upgrade of pdserve itself: new replicas report to the running app's board,
    whose answer was the faults alone (or None)."""
    assert BoardReply.of(None) == BoardReply()
    legacy = {"fail_after_chunks": 2, "corrupt_chunk_seq": None, "delay_per_chunk_s": 0.0}
    assert BoardReply.of(legacy) == BoardReply(faults=FaultInjection(fail_after_chunks=2))
    assert BoardReply.of({"faults": None, "hand_off": True}) == BoardReply(hand_off=True)
