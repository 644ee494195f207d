"""What every chaos scenario shares: greedy requests with known answers, their outcomes, the
server's counters, and the four invariants.

1. **KV back to idle**: no KV block in use, no export pinned, no transfer in flight.
2. **Every request ends**: a 200 with the whole answer (a stream with ``[DONE]``), an
   OpenAI-shaped error, or an SSE error event followed by ``[DONE]``; a request the client
   cancelled ends by the client's hand. A connection dropped mid-request (``connection_lost``)
   is a lost request; only the ingress-kill scenario sets aside the ones inside the killed
   ingress (and notes how many).
3. **Greedy output under the fault equals the no-fault output** (the offline engine's), unless
   the request got an explicit error.
4. **The fault's counter moved by the right amount.**

``PDSERVE_CHAOS=full`` (``make chaos``) scales the traffic up; ``PDSERVE_CHAOS_RESULTS`` names
a JSONL file each scenario appends its figures to (``docs/reliability.md`` is rendered from it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from tests.cluster_fixtures import ServingApp
from tests.integration.support import SERVED_NAME
from tests.waiting import wait_until

FULL = os.environ.get("PDSERVE_CHAOS", "short") == "full"
SCALE = 4 if FULL else 1
MAX_TOKENS = 16
CUT_HEADROOM_TOKENS = 96
"""A stream the client will cut asks for this many tokens more than it reads: a request the
server finished before the client went away is no disconnect, so the server must not be able to
finish it first."""
_WORDS = ("pool", "block", "lease", "token", "chunk", "replica", "stream", "cache", "prefix")


def prompt(tag: str, index: int, long: bool) -> str:
    """A prompt no other test shares: long ones (> the local-prefill threshold) go remote."""
    words = [_WORDS[(index * 7 + k) % len(_WORDS)] for k in range(40 if long else 2)]
    return f"[{tag} {index}] " + " ".join(words)


@dataclass
class Outcome:
    """How one request ended, as the client saw it."""

    prompt: str
    status: int | None = None
    text: str = ""
    error_type: str | None = None
    done: bool = False
    cancelled: bool = False

    @property
    def ended(self) -> bool:
        """Invariant 2 for this request."""
        if self.cancelled:
            return True
        if self.error_type is not None:
            return self.status != 200 or self.done  # an SSE error still ends with [DONE]
        return self.status == 200 and self.done


async def send(
    http: httpx.AsyncClient,
    *,
    app: ServingApp,
    text: str,
    stream: bool = True,
    cancel_after_tokens: int | None = None,
    max_tokens: int = MAX_TOKENS,
) -> Outcome:
    """One greedy completion; a stream is closed after ``cancel_after_tokens`` chunks."""
    if cancel_after_tokens is not None:
        max_tokens = max(max_tokens, cancel_after_tokens + CUT_HEADROOM_TOKENS)
    body = {"model": SERVED_NAME, "prompt": text, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": stream}  # fmt: skip
    outcome = Outcome(text)
    try:
        await _exchange(http, app, body, outcome, stream, cancel_after_tokens)
    except httpx.TransportError as e:  # the ingress died with the request inside it
        outcome.error_type = "connection_lost"
        outcome.text = f"{type(e).__name__}: {e}"
    return outcome


async def _exchange(
    http: httpx.AsyncClient,
    app: ServingApp,
    body: dict[str, object],
    outcome: Outcome,
    stream: bool,
    cancel_after_tokens: int | None,
) -> None:
    url = app.url("/v1/completions")
    if not stream:
        response = await http.post(url, json=body)
        outcome.status, outcome.done = response.status_code, True
        if response.status_code == 200:
            outcome.text = response.json()["choices"][0]["text"]
        else:
            outcome.error_type = response.json()["error"]["type"]
        return
    async with http.stream("POST", url, json=body) as response:
        outcome.status = response.status_code
        if response.status_code != 200:
            outcome.error_type = json.loads(await response.aread())["error"]["type"]
            return
        chunks = 0
        async for line in response.aiter_lines():
            if cancel_after_tokens is not None and chunks >= cancel_after_tokens:
                outcome.cancelled = True
                return  # leaving the block closes the connection mid-stream
            if line == "data: [DONE]":
                outcome.done = True
            elif line.startswith("data: "):
                payload = json.loads(line[6:])
                if "error" in payload:
                    outcome.error_type = payload["error"]["type"]
                else:
                    outcome.text += payload["choices"][0]["text"]
                    chunks += 1


Request = Callable[[httpx.AsyncClient], Awaitable[Outcome | None]]
"""One client action: a request (its outcome) or a fault (None)."""


def gather(requests: Sequence[Request], limit: int | None = None) -> list[Outcome]:
    """Run the requests (and faults) concurrently on one client, at most ``limit`` at a time
    (None: all at once); the requests' outcomes."""

    async def run() -> list[Outcome | None]:
        gate = asyncio.Semaphore(limit or len(requests) or 1)

        async def bounded(request: Request, http: httpx.AsyncClient) -> Outcome | None:
            async with gate:
                return await request(http)

        async with httpx.AsyncClient(timeout=httpx.Timeout(120.0, connect=30.0)) as http:
            return list(await asyncio.gather(*(bounded(r, http) for r in requests)))

    return [outcome for outcome in asyncio.run(run()) if outcome is not None]


def metric(app: ServingApp, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples on ``/metrics`` whose labels include ``labels``."""
    total = 0.0
    for line in httpx.get(app.url("/metrics"), timeout=30).text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def kv_idle(app: ServingApp) -> bool:
    """Invariant 1."""
    names = ("pdserve:kv_blocks_used", "pdserve:kv_exports_pinned", "pdserve:transfer_in_flight")
    return all(metric(app, name) == 0 for name in names)


@dataclass
class FaultResult:
    """One scenario's figures (a row of the fault matrix in ``docs/reliability.md``)."""

    fault: str
    requests: int
    completed: int
    errors: int
    cancelled: int
    lost: int
    identical: int
    counter: str
    expected: float
    moved: float
    kv_idle: bool
    notes: list[str] = field(default_factory=list)


def judge(
    app: ServingApp,
    fault: str,
    outcomes: Sequence[Outcome],
    references: dict[str, str],
    counter: str,
    expected: float,
    moved_fn: Callable[[], float],
    notes: Sequence[str] = (),
) -> FaultResult:
    """Check the four invariants (asserting each) and record the scenario's figures.
    ``moved_fn`` reads how far the fault's counter moved; it is polled for a while, since the
    workers' counters reach ``/metrics`` with their next stats report."""
    with contextlib.suppress(AssertionError):  # recorded, then asserted below
        wait_until(lambda: moved_fn() == expected, 30, f"{fault}: {counter} at {expected}")
    moved = moved_fn()
    idle = True
    try:
        wait_until(lambda: kv_idle(app), 60, f"{fault}: KV back to idle")
    except AssertionError:
        idle = False
    finished = [o for o in outcomes if o.status == 200 and o.done and o.error_type is None]
    result = FaultResult(
        fault=fault,
        requests=len(outcomes),
        completed=len(finished),
        errors=sum(o.error_type is not None for o in outcomes),
        cancelled=sum(o.cancelled for o in outcomes),
        lost=sum(not o.ended for o in outcomes),
        identical=sum(o.text == references[o.prompt] for o in finished),
        counter=counter,
        expected=expected,
        moved=moved,
        kv_idle=idle,
        notes=list(notes),
    )
    _record(result)
    assert idle, f"{fault}: KV still in use after the fault"
    assert result.lost == 0, [o for o in outcomes if not o.ended]
    assert result.identical == result.completed, [
        (o.text, references[o.prompt]) for o in finished if o.text != references[o.prompt]
    ]
    assert moved == expected, f"{fault}: {counter} moved by {moved}, expected {expected}"
    return result


def _record(result: FaultResult) -> None:
    path = os.environ.get("PDSERVE_CHAOS_RESULTS")
    if path:
        with Path(path).open("a") as f:
            f.write(json.dumps(asdict(result)) + "\n")
