"""A rolling upgrade under load, in process: two checkpoints of one architecture (tiny-llama
and the same with other weights), a prefill and a decode worker of each, the real ingress over
pool clients that place a request as the Serve routers do (``kv_index.of_fingerprint`` over the
live replicas). Replicas are swapped one per step in the order ``rolling_steps`` gives while
requests flow: no request fails, each output is one version's own greedy output (never a mix),
the P:D ratio of each version stays within one replica, and every KV block is released."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from benchmarks.rolling_upgrade import Fleet, FleetDecode, FleetPrefill, count_fingerprints
from cluster.ingress import IngressSettings, create_app
from cluster.ingress.model_table import ModelEndpoint
from cluster.ops.upgrade_plan import ratio_deviation, rolling_steps
from core.config import DisaggregationConfig, ModelConfig
from decode.worker import DecodeWorker
from engine.async_engine import AsyncEngine
from engine.builtin.specs import BUILTIN_SPECS
from engine.builtin.writer import write_checkpoint
from engine.engine import LLMEngine
from engine.setup import build_engine_parts
from prefill.worker import PrefillWorker
from replica.kv_compat import replica_kv_compat
from tests.unit.engine.async_engine.tiny_engine import ENGINE, check_integrity
from tests.waiting import async_wait_until
from transfer import InProcKVHub, InProcKVTransport

pytestmark = pytest.mark.timeout(120)

MAX_TOKENS = 8
_rng = random.Random(11)
PROMPTS = [[_rng.randrange(3, 250) for _ in range(n)] for n in (70, 50, 40, 12, 66, 90)]


@dataclass
class Version:
    """One checkpoint's prefill and decode workers and its KV fingerprint."""

    prefill: PrefillWorker
    decode: DecodeWorker
    fingerprint: str
    transports: list[InProcKVTransport]


def _version(model: ModelConfig, hub: InProcKVHub) -> Version:
    engines = [AsyncEngine(LLMEngine(build_engine_parts(model, ENGINE))) for _ in range(2)]
    compat = replica_kv_compat(engines[0].engine.parts, model, ENGINE)
    transports = [InProcKVTransport(e.engine.parts.storage, hub, kv_compat=compat) for e in engines]
    return Version(
        PrefillWorker(engines[0], transports[0], kv_compat=compat),
        DecodeWorker(engines[1], transports[1], kv_compat=compat),
        compat.fingerprint(),
        transports,
    )


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Version, Version]]:
    directory: Path = tmp_path_factory.mktemp("tiny-llama-other-weights")
    write_checkpoint(dataclasses.replace(BUILTIN_SPECS["tiny-llama"], seed=4242), directory)
    hub = InProcKVHub()
    old = _version(ModelConfig(name="builtin:tiny-llama"), hub)
    new = _version(ModelConfig(name=str(directory)), hub)
    yield old, new
    for version in (old, new):
        asyncio.run(version.decode.shutdown())
        asyncio.run(version.prefill.shutdown())
        for transport in version.transports:
            transport.close()


async def _complete(client: httpx.AsyncClient, prompt: list[int]) -> str:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    text: str = response.json()["choices"][0]["text"]
    return text


def test_a_rolling_upgrade_under_load_mixes_no_versions_and_fails_no_request(
    versions: tuple[Version, Version],
) -> None:
    old, new = versions
    assert old.fingerprint != new.fingerprint  # other weights: another model revision
    fleet = Fleet([old.prefill], [old.decode])
    settings = IngressSettings(
        served_model_names=("tiny",),
        max_model_len=512,
        block_size=ENGINE.block_size,
        hash_seed=ENGINE.hash_seed,
        disaggregation=DisaggregationConfig(local_prefill_threshold_tokens=32),
    )
    tokenizer = old.prefill.engine.engine.tokenizer
    endpoint = ModelEndpoint(
        tokenizer, FleetPrefill(fleet), FleetDecode(fleet), settings, versions=fleet
    )
    app = create_app([endpoint]).asgi

    async def main() -> tuple[dict[str, list[str]], list[str], float]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
            references: dict[str, list[str]] = {}
            for version in (old, new):  # each version alone: its own greedy outputs
                fleet.prefills, fleet.decodes = [version.prefill], [version.decode]
                references[version.fingerprint] = [await _complete(client, p) for p in PROMPTS]
            fleet.prefills, fleet.decodes = [old.prefill], [old.decode]
            outputs: list[str] = []
            stop = asyncio.Event()

            async def load() -> None:
                for i in itertools.count():
                    if stop.is_set():
                        return
                    outputs.append(await _complete(client, PROMPTS[i % len(PROMPTS)]))

            clients = [asyncio.create_task(load()) for _ in range(3)]

            def served(n: int) -> bool:
                """``n`` requests done; a client's failed request is raised here at once."""
                for task in clients:
                    if task.done() and task.exception() is not None:
                        raise AssertionError("a request failed") from task.exception()
                return len(outputs) >= n

            worst, replaced = 0.0, (0, 0)
            for step in rolling_steps(1, 1):
                before = len(outputs)
                if step.num_new_prefill > replaced[0]:
                    fleet.prefills = [*fleet.prefills, new.prefill]  # surge, then retire
                    await async_wait_until(lambda n=before: served(n + 3), 30)
                    fleet.prefills = [w for w in fleet.prefills if w is not old.prefill]
                else:
                    fleet.decodes = [*fleet.decodes, new.decode]
                    await async_wait_until(lambda n=before: served(n + 3), 30)
                    fleet.decodes = [w for w in fleet.decodes if w is not old.decode]
                replaced = (step.num_new_prefill, step.num_new_decode)
                for fp in (old.fingerprint, new.fingerprint):
                    p, d = (
                        count_fingerprints(fleet.prefills).get(fp, 0),
                        count_fingerprints(fleet.decodes).get(fp, 0),
                    )
                    worst = max(worst, ratio_deviation(p, d, 1, 1))
                await async_wait_until(lambda n=before: served(n + 6), 30)
            stop.set()
            await asyncio.gather(*clients)
            return references, outputs, worst

    references, outputs, worst = asyncio.run(main())
    assert references[old.fingerprint] != references[new.fingerprint]
    allowed = set(references[old.fingerprint]) | set(references[new.fingerprint])
    mixed = [o for o in outputs if o not in allowed]
    assert not mixed, mixed  # (a failed request fails inside _complete)
    assert len(outputs) >= 12
    assert worst <= 1.0
    assert set(fleet.decoded_on.values()) == {old.fingerprint, new.fingerprint}
    for version in (old, new):
        for worker in (version.prefill, version.decode):
            asyncio.run(async_wait_until(lambda w=worker: not w.stats().kv_blocks_used, 10))
            asyncio.run(check_integrity(worker.engine))
