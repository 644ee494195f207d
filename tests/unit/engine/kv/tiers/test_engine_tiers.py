"""Tiers inside a real engine: outputs token-identical to no tiers, hits from every tier,
nothing held after aborts in the loading state, and a copied prefix published as it lands."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from core.config import DiskTierConfig, EngineConfig, HostTierConfig, KVTiersConfig, ModelConfig
from core.errors import SamplingParamsError
from core.kv_events import BlockStored, KVEventBatch
from core.sampling import SamplingParams
from engine.engine_builder import build_engine
from engine.llm import LLM
from engine.request import RequestStatus

GREEDY = SamplingParams(max_tokens=6, temperature=0.0)


def _prompts(count: int, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    system = [rng.randrange(3, 200) for _ in range(64)]
    return [system + [rng.randrange(3, 200) for _ in range(40)] for _ in range(count)]


def _block_bytes(model: str) -> int:
    probe = LLM(model, max_model_len=256, kv_cache_memory_bytes=4 << 20)
    return probe.engine.parts.layout.block_bytes


def _two_rounds(llm: LLM, prompts: list[list[int]]) -> list[tuple[tuple[int, ...], int]]:
    out = []
    for _ in range(2):
        for prompt in prompts:
            (result,) = llm.generate(
                prompt_token_ids=[prompt], sampling_params=GREEDY, use_tqdm=False
            )
            out.append((tuple(result.outputs[0].token_ids), result.num_cached_tokens or 0))
    llm.engine.scheduler.check_integrity()
    return out


@pytest.mark.parametrize("model", ["builtin:tiny-llama", "builtin:tiny-moe"])
def test_outputs_with_blocks_from_host_and_disk_match_no_tiers(model: str, tmp_path: Path) -> None:
    block = _block_bytes(model)
    prompts = _prompts(8)  # 8 x 7 blocks, 4 shared: ~32 blocks of working set
    device = 16 * block
    plain = _two_rounds(LLM(model, max_model_len=256, kv_cache_memory_bytes=device), prompts)
    for name, tiers in {
        "host": KVTiersConfig(host=HostTierConfig(bytes=64 * block)),
        "host+disk": KVTiersConfig(
            host=HostTierConfig(bytes=8 * block),
            disk=DiskTierConfig(path=str(tmp_path / "hd"), bytes=64 * block),
        ),
        "disk": KVTiersConfig(disk=DiskTierConfig(path=str(tmp_path / "d"), bytes=64 * block)),
    }.items():
        llm = LLM(model, max_model_len=256, kv_cache_memory_bytes=device, kv_tiers=tiers)
        tiered = _two_rounds(llm, prompts)
        assert [t for t, _ in tiered] == [t for t, _ in plain], name
        # the second round finds every full prompt block (6 of 104 tokens) in some tier
        assert [c for _, c in tiered[8:]] == [96] * 8, name
        assert sum(c for _, c in tiered[8:]) > sum(c for _, c in plain[8:]), name
        stats = {s.medium: s for s in llm.engine.scheduler.tier_stats()}
        lower = [m for m in ("host", "disk") if m in stats]
        assert sum(stats[m].hits_total for m in lower) > 0, name
        assert stats[lower[-1]].onload_bytes_total > 0, name
        llm.engine.close()


def test_abort_while_loading_frees_blocks_once_the_copy_is_done() -> None:
    block = _block_bytes("builtin:tiny-llama")
    tiers = KVTiersConfig(host=HostTierConfig(bytes=64 * block))
    llm = LLM(
        "builtin:tiny-llama", max_model_len=256, kv_cache_memory_bytes=12 * block, kv_tiers=tiers
    )
    prompt = _prompts(1)[0]
    _two_rounds(llm, [prompt, *_prompts(2, seed=4)])  # the others push prompt's blocks to host
    engine, scheduler = llm.engine, llm.engine.scheduler
    free_before = scheduler.kv.num_free_blocks
    engine.add_request("again", prompt, GREEDY)
    scheduler.schedule()
    request = scheduler.get_request("again")
    assert request is not None and request.status is RequestStatus.LOADING_KV
    assert engine.abort("again")
    scheduler.check_integrity()  # blocks still held by the cancelled load
    while scheduler.has_unfinished():
        engine.step()
    scheduler.check_integrity()
    assert scheduler.get_request("again") is None
    assert scheduler.kv.num_free_blocks == free_before
    engine.close()


def test_a_session_keep_alive_outlives_the_device_ttl_within_the_servers_bound() -> None:
    now = [0.0]
    tiers = KVTiersConfig(device_ttl_s=10.0, max_keep_alive_s=60.0)
    llm = LLM(
        "builtin:tiny-llama", max_model_len=256, kv_cache_memory_bytes=4 << 20, kv_tiers=tiers
    )
    scheduler = llm.engine.scheduler
    scheduler.kv.pool._clock = lambda: now[0]
    kept, plain = _prompts(2)
    keep = SamplingParams(max_tokens=2, temperature=0.0, kv_keep_alive_s=30.0)
    llm.generate(prompt_token_ids=[kept], sampling_params=keep, use_tqdm=False)
    llm.generate(prompt_token_ids=[plain[64:]], sampling_params=GREEDY, use_tqdm=False)
    now[0] = 20.0  # past the device TTL: only the kept session's blocks stay
    llm.engine.step()
    (again,) = llm.generate(prompt_token_ids=[kept], sampling_params=GREEDY, use_tqdm=False)
    assert again.num_cached_tokens == 96
    (other,) = llm.generate(prompt_token_ids=[plain[64:]], sampling_params=GREEDY, use_tqdm=False)
    assert other.num_cached_tokens == 0
    too_long = SamplingParams(max_tokens=2, kv_keep_alive_s=61.0)
    with pytest.raises(SamplingParamsError, match="max_keep_alive_s=60") as error:
        llm.engine.add_request("x", kept, too_long)
    assert error.value.param == "kv_keep_alive_s"
    with pytest.raises(SamplingParamsError, match="kv_keep_alive_s must be"):
        SamplingParams(kv_keep_alive_s=-1.0)


def test_an_admitted_prefix_is_published_without_waiting_for_a_step() -> None:
    block = _block_bytes("builtin:tiny-llama")
    batches: list[KVEventBatch] = []
    engine_cfg = EngineConfig(
        max_model_len=256,
        kv_cache_memory_bytes=16 * block,
        kv_tiers=KVTiersConfig(host=HostTierConfig(bytes=4 * block)),
    )
    model_cfg = ModelConfig(name="builtin:tiny-llama")
    engine = build_engine(model_cfg, engine_cfg, kv_event_callback=batches.append).engine
    payloads = [torch.full((block,), i, dtype=torch.uint8) for i in range(2)]
    assert engine.admit_prefix([11, 12], payloads) == 2
    (batch,) = batches  # no step ran: the routers still hear of the copy now
    assert batch.events == [BlockStored([h], None, [], 16, medium="host") for h in (11, 12)]
    engine.close()
