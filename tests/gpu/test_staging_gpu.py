"""KV staging on CUDA: pinned host mirror, side-stream copies, and a prefill -> decode handoff
through the mirror that reproduces a local run."""

from __future__ import annotations

import pytest
import torch

from core.config import EngineConfig, ModelConfig
from core.kv_layout import KVLayout
from core.sampling import SamplingParams
from engine import LLM
from engine.engine import LLMEngine
from engine.kv.storage import KVStorage
from engine.setup import build_engine_parts
from tests.gpu.helpers import KV_BYTES, fresh_seed, random_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

LAYOUT = KVLayout(
    "m", "bfloat16", block_size=16, num_layers=4, num_kv_heads=8, head_dim=64, hash_seed=0
)
MODEL = "builtin:tiny-llama"


def storage() -> KVStorage:
    store = KVStorage(LAYOUT, 64, torch.device("cuda"))
    assert store.staged and store.host.is_pinned()
    assert store._copier is not None and store._copier.stream is not None
    assert store._copier.stream != torch.cuda.current_stream()  # never the compute stream
    return store


def test_export_copies_exactly_the_staged_blocks() -> None:
    store = storage()
    store.kv.copy_(torch.randn(store.kv.shape, device="cuda"))
    ids = [3, 4, 5, 9, 20, 21, 63]
    store.stage_to_host(ids)
    for block_id in range(64):
        expected = store.kv[block_id].cpu()
        view = torch.frombuffer(bytearray(store.block_view(block_id)), dtype=torch.bfloat16)
        if block_id in ids:
            assert torch.equal(view, expected.reshape(-1))
        else:
            assert not view.any()  # never staged: the mirror still holds zeros
    assert store.staging.num_pending_exports == 0


def test_compute_stream_sees_imports_without_a_host_wait() -> None:
    store = storage()
    ids = list(range(1, 60, 2))
    for block_id in ids:
        store.host[block_id].fill_(float(block_id))
    store.stage_to_device(ids)
    store.fence_uploads()  # device-side: the compute stream waits, the host goes on
    sums = store.kv[ids].float().flatten(1).mean(1)  # queued on the compute stream
    assert sums.tolist() == [float(b) for b in ids]
    assert store.staging.fence_uploads() == 0


def test_prefill_to_decode_through_the_mirror_matches_a_local_run() -> None:
    engine_cfg = EngineConfig(max_model_len=1024, kv_cache_memory_bytes=KV_BYTES)
    prefill = LLMEngine(build_engine_parts(ModelConfig(name=MODEL), engine_cfg))
    decode = LLMEngine(build_engine_parts(ModelConfig(name=MODEL), engine_cfg))
    local = LLM(MODEL, max_model_len=1024, kv_cache_memory_bytes=KV_BYTES)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(random_prompts([37, 300], 320, fresh_seed())):
        rid = f"handoff-{i}"
        prefill.add_request(rid, prompt, params, prefill_only=True)
        while prefill.has_unfinished():
            prefill.step()
        pinned = prefill.get_pinned_blocks(rid)
        assert pinned is not None
        prefill.parts.storage.stage_to_host(pinned.block_ids)

        allocation = decode.add_import_request(rid, prompt, params, pinned.first_token_id)
        for index in allocation.missing_block_indices:
            src = prefill.parts.storage.block_view(pinned.block_ids[index])
            decode.parts.storage.block_view(allocation.block_ids[index])[:] = src
        decode.parts.storage.stage_to_device(
            [allocation.block_ids[i] for i in allocation.missing_block_indices]
        )
        prefill.release(rid)
        assert decode.mark_kv_ready(rid)
        outputs = []
        while decode.has_unfinished():
            outputs.extend(decode.step())
        expected = local.generate(prompt_token_ids=[prompt], sampling_params=params)[0]
        assert outputs[-1].token_ids == expected.token_ids
