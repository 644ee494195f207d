"""Tensor-parallel engines on the CPU: ``LLM(model, tensor_parallel_size=N)`` with real follower
processes over gloo. Greedy output must equal one rank's, through chunked prefill, prefix hits,
preemption, an 8-bit KV cache, replicated KV heads and sliding windows; followers stop with the
``LLM`` and a dead follower fails the step without hanging or leaking."""

from __future__ import annotations

import asyncio
import hashlib
import random
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from core.config import EngineConfig, KVTiersConfig, ModelConfig
from core.errors import ConfigError, LayoutMismatchError, UnavailableError
from core.hashing import HASH_ALGORITHM
from core.sampling import SamplingParams
from engine import LLM
from engine.builtin import resolve_model
from engine.engine import LLMEngine
from engine.engine_builder import build_async_engine
from engine.gangs.tp_gang import Gang
from engine.gangs.tp_step import STOP, LeaderRunner, TPStep, decode_step, encode_step
from engine.models import ModelArchConfig
from engine.scheduler.output import ScheduledRequest
from tests.unit.engine.models.hf_checkpoints import add_byte_tokenizer, save_checkpoint
from tests.waiting import wait_until

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
SHARED = [7, 8, 9, 10, 11, 12, 13, 14] * 5  # 40 tokens: two full blocks of 16 shared
PROMPTS = [[*SHARED, 3, 4, 5], [*SHARED, 60, 61], [21, 22, 23, 24] * 12, [5, 6]]


def greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    outputs = llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY, use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outputs]


def leader_gang(llm: LLM | LLMEngine) -> Gang:
    runner = (llm.engine if isinstance(llm, LLM) else llm).runner
    assert isinstance(runner, LeaderRunner) and runner.gang is not None
    return runner.gang


def step_item(request_id: str, tokens: list[int], prompt_logprobs: int | None = None):
    return ScheduledRequest(
        request_id,
        tokens,
        start_position=3,
        block_ids=[4, 9, 0],
        samples_token=prompt_logprobs is None,
        sampling_params=SamplingParams(prompt_logprobs=prompt_logprobs),
        num_output_tokens=0,
    )


def test_a_step_travels_as_words_and_back() -> None:
    step = TPStep(
        released=("done-1", "préempté"),
        scheduled=(step_item("a", [1, 2, 3]), step_item("b-é", [9], prompt_logprobs=2)),
    )
    decoded = decode_step(encode_step(step))
    assert decoded is not None
    assert decoded.released == step.released
    for got, sent in zip(decoded.scheduled, step.scheduled, strict=True):
        assert (got.request_id, got.token_ids, got.start_position, got.block_ids) == (
            sent.request_id,
            sent.token_ids,
            sent.start_position,
            sent.block_ids,
        )
        assert got.samples_token == sent.samples_token
        assert got.sampling_params.prompt_logprobs == sent.sampling_params.prompt_logprobs
    assert decode_step(encode_step(None)) is None
    assert decode_step(encode_step(STOP)) == STOP  # an empty step is not a stop


def test_a_torn_step_is_refused() -> None:
    words = encode_step(TPStep(("x",), (step_item("a", [1, 2, 3]),)))
    with pytest.raises(ValueError, match="ends early"):
        decode_step(words[:-3])
    with pytest.raises(ValueError, match="left over"):
        decode_step(words.new_tensor([*words.tolist(), 0]))


def test_one_rank_layouts_keep_their_fingerprint_and_ranks_differ() -> None:
    arch = ModelArchConfig.from_dir(resolve_model("builtin:tiny-llama"))
    layout = arch.kv_layout("m", "float32", 16, 0)
    split_fields = ("tp_size", "tp_rank", "total_kv_heads")
    legacy = {k: v for k, v in asdict(layout).items() if k not in split_fields}
    text = "|".join(
        f"{k}={v}" for k, v in sorted({**legacy, "hash_algorithm": HASH_ALGORITHM}.items())
    )
    assert layout.fingerprint() == hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
    rank1 = replace(layout, num_kv_heads=1, tp_size=2, tp_rank=1, total_kv_heads=2)
    assert rank1.unsplit() == layout  # what gangs of different sizes agree on
    assert (
        len({layout.fingerprint(), rank1.fingerprint(), replace(rank1, tp_rank=0).fingerprint()})
        == 3
    )
    with pytest.raises(LayoutMismatchError, match="tp_size: 1 != 2"):
        layout.check_compatible(rank1)


@pytest.mark.parametrize(
    "options",
    [
        {"compile_model": True},
    ],
)
def test_combinations_not_built_are_refused_by_the_config(options: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match="tensor_parallel_size \\(2\\) cannot be combined"):
        EngineConfig(tensor_parallel_size=2, **options)


def test_a_size_that_does_not_split_the_model_is_refused_before_any_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_gang(*_: object) -> None:
        raise AssertionError("no follower may start")

    monkeypatch.setattr("engine.gangs.tp_gang.start_gang", no_gang)
    with pytest.raises(ConfigError, match="tensor_parallel_size=3 does not divide the 8 attention"):
        LLM("builtin:tiny-llama", tensor_parallel_size=3)


def test_tp2_equals_one_rank_through_chunks_prefix_hits_and_preemption() -> None:
    options = {
        "max_num_batched_tokens": 32,  # prompts of 40+ tokens prefill in chunks
        "max_model_len": 64,
        # 16 KiB a block on each of two ranks (one of the two KV heads): 10 blocks for four
        # requests that need 11 at the end (two share a prefix), so some are preempted
        "kv_cache_memory_bytes": 10 * 16 * 1024,
        "max_num_seqs": 4,
    }
    reference = LLM("builtin:tiny-llama", **options)
    expected = greedy(reference, PROMPTS)
    with LLM("builtin:tiny-llama", tensor_parallel_size=2, **options) as llm:
        assert greedy(llm, PROMPTS) == expected
        again = llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY, use_tqdm=False)
        assert [list(o.outputs[0].token_ids) for o in again] == expected
        assert max(o.num_cached_tokens for o in again) >= 16  # the shared prefix hit
        assert llm.engine.scheduler.stats().num_preemptions_total > 0
        followers = leader_gang(llm).processes
        assert llm.engine.scheduler.stats().num_used_blocks == 0
    assert all(process.wait(timeout=30) == 0 for process in followers)


def test_tp2_with_tiers_and_overlapped_steps_equals_one_rank(tmp_path: Path) -> None:
    """Rank 0's tiers hold every rank's share of a block: blocks evicted to host and disk and
    loaded back give one rank's outputs, with tier hits. The steps overlap
    (``async_scheduling: on``): rank 0 shares the pending sampled ids with the follower over
    the collective."""
    rng = random.Random(3)
    system = [rng.randrange(3, 200) for _ in range(64)]
    prompts = [system + [rng.randrange(3, 200) for _ in range(40)] for _ in range(6)]
    block = 32 * 1024  # tiny-llama's whole block (both KV heads); 16 KiB on each of two ranks
    tiers = KVTiersConfig(
        host={"bytes": 6 * block}, disk={"path": str(tmp_path), "bytes": 64 * block}
    )
    options = {"max_model_len": 256, "max_num_seqs": 2, "max_num_batched_tokens": 64}
    one_rank = LLM("builtin:tiny-llama", kv_cache_memory_bytes=16 * block, **options)
    expected = [greedy(one_rank, [p])[0] for p in prompts * 2]
    with LLM(
        "builtin:tiny-llama",
        tensor_parallel_size=2,
        kv_cache_memory_bytes=8 * block,  # per rank: 16 blocks of its half
        kv_tiers=tiers,
        async_scheduling="on",
        **options,
    ) as llm:
        assert llm.engine.async_scheduling
        got = [greedy(llm, [prompt])[0] for prompt in prompts * 2]
        stats = {s.medium: s for s in llm.engine.scheduler.tier_stats()}
        llm.engine.scheduler.check_integrity()
    assert got == expected
    assert stats["host"].hits_total + stats["disk"].hits_total > 0
    assert stats["disk"].onload_bytes_total > 0


def test_tp2_with_an_8bit_kv_cache_and_prompt_logprobs() -> None:
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, prompt_logprobs=1)
    reference = LLM("builtin:tiny-llama", kv_cache_dtype="int8")
    expected = reference.generate(prompt_token_ids=PROMPTS[:2], sampling_params=params)
    with LLM("builtin:tiny-llama", kv_cache_dtype="int8", tensor_parallel_size=2) as llm:
        got = llm.generate(prompt_token_ids=PROMPTS[:2], sampling_params=params, use_tqdm=False)
    for mine, theirs in zip(got, expected, strict=True):
        assert mine.outputs[0].token_ids == theirs.outputs[0].token_ids
        assert mine.prompt_logprobs is not None and theirs.prompt_logprobs is not None
        for a, b in zip(mine.prompt_logprobs[1:], theirs.prompt_logprobs[1:], strict=True):
            assert a is not None and b is not None
            assert a.keys() == b.keys()
            for token in a:  # sums in another order, then 8-bit rounding of K and V
                assert abs(a[token].logprob - b[token].logprob) < 5e-3


def test_a_moe_engine_decodes_as_one_rank_with_its_experts_split() -> None:
    options = {"max_num_batched_tokens": 32, "max_model_len": 128}
    expected = greedy(LLM("builtin:tiny-moe", **options), PROMPTS)
    with LLM("builtin:tiny-moe", tensor_parallel_size=2, **options) as llm:
        assert greedy(llm, PROMPTS) == expected


@pytest.mark.parametrize(
    ("preset", "size"),
    [
        ("mistral-swa", 2),  # a sliding window shorter than the prompts
        ("llama-mqa", 4),  # four ranks over one KV head
    ],
)
def test_hf_families_decode_as_one_rank(tmp_path: Path, preset: str, size: int) -> None:
    checkpoint = save_checkpoint(preset, tmp_path / preset)
    add_byte_tokenizer(checkpoint.path)
    path = str(checkpoint.path)
    prompts = [[3, 17, 29, 44, 5, 61, 7] * 5, [9, 2, 33, 14] * 3]
    expected = greedy(LLM(path, dtype="float32"), prompts)
    with LLM(path, dtype="float32", tensor_parallel_size=size) as llm:
        assert greedy(llm, prompts) == expected


def test_an_async_engine_serves_a_tp_gang_and_its_shutdown_stops_the_followers() -> None:
    """What a replica runs: ``build_async_engine`` with ``tensor_parallel_size: 2`` streams the
    tokens one rank would, and shutting the engine thread down stops the follower."""
    expected = greedy(LLM("builtin:tiny-llama"), PROMPTS[:1])[0]
    engine = build_async_engine(
        ModelConfig(name="builtin:tiny-llama"), EngineConfig(tensor_parallel_size=2)
    )
    followers = leader_gang(engine.engine).processes

    async def stream() -> list[int]:
        tokens: list[int] = []
        async for output in engine.generate("tp-async", PROMPTS[0], GREEDY):
            tokens = list(output.outputs[0].token_ids)
        return tokens

    try:
        assert asyncio.run(stream()) == expected
    finally:
        engine.shutdown()
    assert all(process.wait(timeout=30) == 0 for process in followers)


def test_a_replica_whose_follower_died_stops_its_engine_for_the_health_check() -> None:
    """A broken gang never steps again: the engine says so (``usable``), the engine thread
    stops, and the replica's health check (``is_running``) turns it over to Serve."""
    engine = build_async_engine(
        ModelConfig(name="builtin:tiny-llama"), EngineConfig(tensor_parallel_size=2)
    )
    [follower] = leader_gang(engine.engine).processes
    follower.kill()
    follower.wait(timeout=30)

    async def one() -> None:
        async for _ in engine.generate("after-death", PROMPTS[0], GREEDY):
            pass

    try:
        with pytest.raises(UnavailableError, match="peer rank died"):
            asyncio.run(one())
        wait_until(lambda: not engine.is_running(), timeout_s=30, message="the engine stops")
        assert not engine.engine.usable
    finally:
        engine.shutdown()
    stats = engine.engine.scheduler.stats()
    assert stats.num_used_blocks == 0 and stats.num_running == 0
