"""The transport's KV connector through the engine's interface: two engines hand off a prompt
over the in-process transport (the gRPC transport's exporter and import runner), the export is
freed once pulled, and an export released before its pull fails the import."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from core.config import EngineConfig, ModelConfig
from core.kv_handle import TransferFailure
from core.sampling import SamplingParams
from engine.engine import LLMEngine
from engine.kv_connector import ImportResult, KVConnector
from engine.kv_connector.connected_engine import ConnectedEngine
from engine.outputs import RequestOutput
from engine.scheduler.output import ImportAllocation
from engine.setup import build_engine_parts
from replica.kv_connector.transport_connector import TransportKVConnector
from transfer import InProcKVHub, InProcKVTransport

MODEL = ModelConfig(name="builtin:tiny-llama")
ENGINE = EngineConfig(max_model_len=128, kv_cache_memory_bytes=4 << 20, block_size=16)
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
PROMPT = list(range(3, 43))  # 40 tokens: two full blocks and a partial one


class Side:
    def __init__(self, hub: InProcKVHub) -> None:
        engine = LLMEngine(build_engine_parts(MODEL, ENGINE))
        self.transport = InProcKVTransport(engine.parts.storage, hub)
        self.connector = TransportKVConnector(self.transport)
        contract: KVConnector = self.connector
        self.connected = ConnectedEngine(engine, contract)


def _run(*sides: Side) -> dict[str, list[RequestOutput]]:
    outputs: dict[str, list[RequestOutput]] = {}
    for _ in range(2000):
        for side in sides:
            for output in side.connected.step():
                outputs.setdefault(output.request_id, []).append(output)
        if not any(s.connected.engine.has_unfinished() for s in sides):
            return outputs
        sides[-1].connector.wait(0.01)
    raise AssertionError("the engines never went idle")


@pytest.fixture
def pair() -> Iterator[list[Side]]:
    hub = InProcKVHub()
    sides = [Side(hub), Side(hub)]
    yield sides
    for side in sides:
        side.transport.close()


@pytest.mark.timeout(120)
def test_a_pipelined_pull_hands_off_the_prompt_and_frees_the_export(pair: list[Side]) -> None:
    reference = LLMEngine(build_engine_parts(MODEL, ENGINE))
    reference.add_request("ref", PROMPT, GREEDY)
    expected: tuple[int, ...] = ()
    while reference.has_unfinished():
        for output in reference.step():
            expected = output.outputs[0].token_ids
    num_free = reference.scheduler.kv.num_free_blocks  # every block free again (cached or not)

    prefill, decode = pair
    handle = prefill.connector.open_export("r", num_blocks=3)
    prefill.connected.add_export("r", PROMPT, GREEDY)
    allocation = decode.connected.add_import(
        "r", PROMPT, GREEDY, decode.connector.add_source(handle)
    )
    assert allocation == ImportAllocation("r", [1, 2, 3], num_local_blocks=0)
    decoded = _run(prefill, decode)["r"]
    assert decoded[-1].outputs[0].token_ids == expected
    _run(prefill)  # the export's release may land after the decode finished
    for _ in range(200):
        if prefill.connected.engine.get_pinned_blocks("r") is None:
            break
        prefill.connector.wait(0.01)
        prefill.connected.step()
    assert prefill.connected.engine.get_pinned_blocks("r") is None
    for side in pair:
        side.connected.engine.scheduler.check_integrity()
        assert side.connected.engine.scheduler.kv.num_free_blocks == num_free


@pytest.mark.timeout(120)
def test_an_export_released_before_its_pull_fails_the_import(pair: list[Side]) -> None:
    prefill, decode = pair
    handle = prefill.connector.open_export("r", num_blocks=3)
    prefill.connected.add_export("r", PROMPT, GREEDY)
    source = decode.connector.add_source(handle)
    prefill.connected.engine.abort("r")  # it never held blocks: the step's report loses it
    prefill.connected.step()  # ... and the connector releases the export
    assert prefill.connector.take_finished().is_empty
    decode.connected.add_import("r", PROMPT, GREEDY, source)
    decode.connector.start_transfers()
    assert decode.connector.wait(10.0)
    (ended,) = decode.connector.take_finished().imports
    assert (ended.request_id, ended.result) == ("r", ImportResult.FAILED)
    assert ended.failure is TransferFailure.UNKNOWN_TRANSFER  # the reason an ingress migrates on
