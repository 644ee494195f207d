"""The in-process KV connector through its interface: exact block ids exported, imported, freed
and finished, first on fake storages, then between two real engines (token-identical output)."""

from __future__ import annotations

import pytest

from core.config import EngineConfig, ModelConfig
from core.sampling import SamplingParams
from engine.engine import LLMEngine
from engine.kv_connector import (
    ImportEnded,
    ImportResult,
    InProcKVConnector,
    InProcKVHub,
    KVConnector,
    KVConnectorFinished,
    KVImportSource,
)
from engine.kv_connector.connected_engine import ConnectedEngine
from engine.outputs import RequestOutput
from engine.scheduler.output import ImportAllocation, PinnedBlocks
from engine.setup import build_engine_parts

BLOCK_BYTES = 4


class FakeStorage:
    """Blocks of ``BLOCK_BYTES`` bytes each; records the uploads."""

    def __init__(self, num_blocks: int, fill: int = 0) -> None:
        self.blocks = [bytearray([fill + b] * BLOCK_BYTES) for b in range(num_blocks)]
        self.uploaded: list[list[int]] = []

    def block_view(self, block_id: int) -> memoryview:
        return memoryview(self.blocks[block_id])

    def stage_to_device(self, block_ids: list[int]) -> None:
        self.uploaded.append(list(block_ids))


def _pair() -> tuple[InProcKVConnector, InProcKVConnector, FakeStorage, FakeStorage]:
    hub = InProcKVHub()
    src, dst = FakeStorage(8, fill=100), FakeStorage(8)
    return InProcKVConnector(hub, src), InProcKVConnector(hub, dst), src, dst


def test_an_import_copies_exactly_the_missing_blocks_once_the_export_finished() -> None:
    prefill, decode, src, dst = _pair()
    connectors: list[KVConnector] = [prefill, decode]  # both satisfy the contract
    assert len(connectors) == 2
    prefill.export_blocks("r", [3, 5])
    assert prefill.exported_block_ids("r") == [3, 5]
    # the decode side already holds block 0 of the prompt (a local prefix hit)
    decode.import_blocks(ImportAllocation("r", [1, 2, 4], num_local_blocks=1), KVImportSource("r"))
    decode.start_transfers()  # the prefill still runs: nothing copied
    assert dst.uploaded == [] and not decode.wait(0.0)
    assert decode.take_finished() == KVConnectorFinished()
    prefill.export_finished(PinnedBlocks("r", [3, 5, 6], [], 40, first_token_id=7))
    decode.start_transfers()
    assert dst.uploaded == [[2, 4]]
    assert dst.blocks[2] == src.blocks[5] and dst.blocks[4] == src.blocks[6]
    assert dst.blocks[1] == bytearray([1] * BLOCK_BYTES)  # the local hit is left alone
    assert decode.wait(0.0)
    assert decode.take_finished() == KVConnectorFinished(
        imports=(ImportEnded("r", ImportResult.READY, 7, ()),)
    )
    assert decode.take_finished().is_empty  # reported once
    assert prefill.take_finished() == KVConnectorFinished(freed_exports=("r",))
    assert prefill.exported_block_ids("r") == []


def test_an_export_freed_before_its_import_fails_the_import() -> None:
    prefill, decode, _, dst = _pair()
    prefill.export_blocks("r", [3])
    decode.import_blocks(ImportAllocation("r", [1, 2], num_local_blocks=0), KVImportSource("r"))
    decode.before_free("x")  # another request's blocks: nothing of ours
    prefill.before_free("r")  # preempted or aborted on the prefill side
    assert prefill.take_finished() == KVConnectorFinished(freed_exports=("r",))
    decode.start_transfers()
    assert decode.take_finished().imports == (ImportEnded("r", ImportResult.FAILED),)
    assert dst.uploaded == []


def test_an_import_freed_before_its_copy_is_dropped_and_the_export_kept() -> None:
    prefill, decode, _, dst = _pair()
    prefill.export_finished(PinnedBlocks("r", [3], [], 10, first_token_id=7))
    decode.import_blocks(ImportAllocation("r", [2], num_local_blocks=0), KVImportSource("r"))
    decode.before_free("r")  # the decode request was aborted: its own blocks, not the export
    decode.start_transfers()
    assert decode.take_finished().is_empty and dst.uploaded == []
    assert prefill.exported_block_ids("r") == [3]
    assert prefill.take_finished().is_empty


# -- two engines ----------------------------------------------------------------------------------

MODEL = ModelConfig(name="builtin:tiny-llama")
ENGINE = EngineConfig(max_model_len=128, kv_cache_memory_bytes=4 << 20, block_size=16)
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
PROMPT = list(range(3, 43))  # 40 tokens: two full blocks and a partial one


def _engine() -> LLMEngine:
    return LLMEngine(build_engine_parts(MODEL, ENGINE))


def _connected(hub: InProcKVHub) -> ConnectedEngine:
    engine = _engine()
    return ConnectedEngine(engine, InProcKVConnector(hub, engine.parts.storage))


def _run(*engines: ConnectedEngine) -> dict[str, list[RequestOutput]]:
    outputs: dict[str, list[RequestOutput]] = {}
    for _ in range(100):
        for connected in engines:
            for output in connected.step():
                outputs.setdefault(output.request_id, []).append(output)
        if not any(c.engine.has_unfinished() for c in engines):
            return outputs
    raise AssertionError("the engines never went idle")


@pytest.mark.timeout(120)
def test_two_engines_hand_off_a_prompt_and_decode_the_same_tokens() -> None:
    reference = _engine()
    reference.add_request("ref", PROMPT, GREEDY)
    expected = _run(
        ConnectedEngine(reference, InProcKVConnector(InProcKVHub(), reference.parts.storage))
    )
    expected_ids = expected["ref"][-1].outputs[0].token_ids

    hub = InProcKVHub()
    prefill, decode = _connected(hub), _connected(hub)
    assert isinstance(prefill.connector, InProcKVConnector)
    prefill.add_export("r", PROMPT, GREEDY)
    allocation = decode.add_import("r", PROMPT, GREEDY, KVImportSource("r"))
    assert allocation == ImportAllocation("r", [1, 2, 3], num_local_blocks=0)
    prefill.step()  # the whole prompt in one chunk: exported and finished
    assert prefill.connector.exported_block_ids("r") == [1, 2, 3]
    decoded = _run(prefill, decode)["r"]
    assert decoded[-1].outputs[0].token_ids == expected_ids
    assert prefill.engine.get_pinned_blocks("r") is None  # the import freed the export
    assert prefill.connector.exported_block_ids("r") == []
    prefill.engine.scheduler.check_integrity()
    decode.engine.scheduler.check_integrity()
    assert prefill.engine.scheduler.kv.num_free_blocks == decode.engine.scheduler.kv.num_free_blocks
