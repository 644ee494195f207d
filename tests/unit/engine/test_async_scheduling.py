"""Overlapped steps (``async_scheduling: on``) against plain steps, on the CPU.

On a CPU nothing truly runs in parallel, but the step loop is the same one CUDA runs: step N+1
is planned and queued before step N's sampled ids are read, decode inputs still pending come
from the previous step's device tensor, and the scheduler counts those tokens as placeholders.
Every observable output must equal the plain loop's, whatever the batch holds.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from core.sampling import SamplingParams, StructuredOutput
from engine import LLM
from engine.device_io import PendingRead
from engine.engine import LLMEngine
from engine.outputs import RequestOutput

MODEL = "builtin:tiny-llama"
PREFIX = [11 + (i * 7) % 90 for i in range(37)]


@pytest.fixture(scope="module")
def plain() -> LLM:
    return LLM(MODEL, async_scheduling="off", max_num_batched_tokens=48)


@pytest.fixture(scope="module")
def overlapped() -> LLM:
    return LLM(MODEL, async_scheduling="on", max_num_batched_tokens=48)


def summary(outputs: list[RequestOutput]) -> list[tuple[object, ...]]:
    return [
        (
            seq.token_ids,
            seq.text,
            seq.finish_reason,
            seq.stop_reason,
            [
                sorted((tid, round(lp.logprob, 4), lp.rank) for tid, lp in step.items())
                for step in seq.logprobs or []
            ],
        )
        for out in outputs
        for seq in out.outputs
    ]


def generate_both(
    plain: LLM, overlapped: LLM, prompts: list[list[int]], params: list[SamplingParams]
) -> list[tuple[object, ...]]:
    expected = plain.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    got = overlapped.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert summary(got) == summary(expected)
    for llm in (plain, overlapped):
        llm.engine.scheduler.check_integrity()
        assert not llm.engine.has_unfinished()
    return summary(got)


def test_overlap_is_on_only_when_asked_or_on_cuda(plain: LLM, overlapped: LLM) -> None:
    assert overlapped.engine.async_scheduling and overlapped.engine.scheduler.async_scheduling
    assert not plain.engine.async_scheduling
    assert not LLM(MODEL).engine.async_scheduling  # auto: on for CUDA only


def test_mixed_batch_is_token_identical(plain: LLM, overlapped: LLM) -> None:
    prompts = [PREFIX + [5 + i] * (3 + 11 * i) for i in range(8)]  # shared prefix: cache hits
    greedy = SamplingParams(temperature=0.0, max_tokens=17, ignore_eos=True)
    params = [
        greedy,
        SamplingParams(temperature=0.0, max_tokens=1),
        SamplingParams(temperature=0.0, max_tokens=9, logprobs=3),
        SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=7, max_tokens=12),
        SamplingParams(temperature=1.0, seed=3, max_tokens=10, n=2),
        SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=(54, 77), min_tokens=4),
        SamplingParams(temperature=0.0, max_tokens=25, logit_bias=((40, 5.0), (41, -3.0))),
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
    ]
    generate_both(plain, overlapped, prompts, params)


def test_stop_strings_end_requests_alike(plain: LLM, overlapped: LLM) -> None:
    prompt = PREFIX[:20]
    free = plain.generate(
        prompt_token_ids=[prompt],
        sampling_params=SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
        use_tqdm=False,
    )[0].outputs[0]
    stop = free.text[5:8]  # a string the greedy text reaches after a few tokens
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=(stop,))
    (row,) = generate_both(plain, overlapped, [prompt, prompt[:15]], [params, params])[:1]
    assert row[2] == "stop"


def test_penalties_and_structured_output_run_synchronously_and_alike(
    plain: LLM, overlapped: LLM
) -> None:
    prompts = [PREFIX[:9], PREFIX[:14], PREFIX[:21]]
    params = [
        SamplingParams(
            temperature=0.0,
            max_tokens=20,
            presence_penalty=0.5,
            frequency_penalty=0.3,
            repetition_penalty=1.3,
        ),
        SamplingParams(
            temperature=1.0,
            seed=5,
            max_tokens=60,
            structured_output=StructuredOutput("json_object"),
        ),
        SamplingParams(temperature=0.0, max_tokens=15, ignore_eos=True),
    ]
    generate_both(plain, overlapped, prompts, params)


def test_preemption_is_token_identical() -> None:
    kwargs = {"kv_cache_memory_bytes": 1 << 20, "max_num_batched_tokens": 64}
    plain = LLM(MODEL, async_scheduling="off", **kwargs)  # type: ignore[arg-type]
    overlapped = LLM(MODEL, async_scheduling="on", **kwargs)  # type: ignore[arg-type]
    prompts = [[3 + i] * (20 + 5 * i) for i in range(6)]
    params = [SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True)] * 6
    generate_both(plain, overlapped, prompts, params)
    assert overlapped.engine.scheduler.stats().num_preemptions_total > 0


def drive(engine: LLMEngine, abort_at: int) -> dict[str, list[int]]:
    """Four requests; ``r1`` is aborted after ``abort_at`` steps; every token of the others."""
    for i in range(4):
        params = SamplingParams(temperature=0.0, max_tokens=12 + 3 * i, ignore_eos=True)
        engine.add_request(f"r{i}", PREFIX[: 10 + 4 * i], params)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(4)}
    steps = 0
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.outputs[0].token_ids[len(tokens[out.request_id]) :]
        steps += 1
        if steps == abort_at:
            assert engine.abort("r1")
    engine.scheduler.check_integrity()
    assert engine.scheduler.stats().num_running == 0
    del tokens["r1"]
    return tokens


@pytest.mark.parametrize("abort_at", [2, 5])
def test_abort_mid_flight_leaves_the_others_alone(
    plain: LLM, overlapped: LLM, abort_at: int
) -> None:
    assert drive(overlapped.engine, abort_at) == drive(plain.engine, abort_at)


def test_the_host_reads_a_step_only_after_queueing_the_next(
    overlapped: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = overlapped.engine
    events: list[str] = []
    execute, wait = engine.runner.execute, PendingRead.wait

    def logged_execute(*args: object, **kwargs: object) -> object:
        events.append("queue")
        return execute(*args, **kwargs)  # type: ignore[arg-type]

    def logged_wait(self: PendingRead) -> object:
        events.append("read")
        return wait(self)

    monkeypatch.setattr(engine.runner, "execute", logged_execute)
    monkeypatch.setattr(PendingRead, "wait", logged_wait)
    waits_before = engine.reader.num_waits
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    engine.add_request("alone", PREFIX[:12], params)
    steps = 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    # queue(1) queue(2) read(1) queue(3) read(2) ... queue(8) read(7) read(8): each read but
    # the last comes after the next step was queued; the 8th token ends the request by length,
    # known before its id is, so no extra step is queued for it
    assert events[:2] == ["queue", "queue"]
    assert events[-3:] == ["queue", "read", "read"]
    for i, event in enumerate(events[:-1]):
        if event == "read":
            assert events[i - 1] == "queue"
    assert events.count("read") == events.count("queue") == 8  # one prefill, seven decodes
    assert engine.reader.num_waits - waits_before <= steps  # at most one host wait a step


def test_prefill_only_request_pins_in_the_step_that_samples(overlapped: LLM) -> None:
    engine = overlapped.engine
    params = SamplingParams(temperature=0.0, max_tokens=5)
    engine.add_request("pf", PREFIX, params, prefill_only=True)
    outputs = engine.step()
    assert [o.request_id for o in outputs] == ["pf"] and outputs[0].finished
    pinned = engine.get_pinned_blocks("pf")
    assert pinned is not None and pinned.num_tokens == len(PREFIX)
    assert not engine.has_unfinished()
    assert engine.release("pf")
    engine.scheduler.check_integrity()


@pytest.fixture
def failing_engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[LLMEngine]:
    llm = LLM(MODEL, async_scheduling="on")
    yield llm.engine
    llm.engine.scheduler.check_integrity()


def test_a_failing_step_aborts_its_plan_and_the_step_in_flight(
    failing_engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = failing_engine
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    engine.add_request("a", PREFIX[:10], params)
    engine.step()  # queued, not read
    engine.step()  # the first decode queued, the prefill read
    real = engine.runner.execute
    calls = []

    def explode(*args: object, **kwargs: object) -> object:
        calls.append(1)
        raise RuntimeError("injected")

    monkeypatch.setattr(engine.runner, "execute", explode)
    engine.add_request("b", PREFIX[:6], params)
    with pytest.raises(RuntimeError, match="injected"):
        engine.step()
    monkeypatch.setattr(engine.runner, "execute", real)
    assert calls == [1]
    assert engine.scheduler.get_request("a") is None
    assert engine.scheduler.get_request("b") is None
    assert not engine.has_unfinished()
    assert engine.scheduler.stats().num_used_blocks == 0


def test_aborting_the_only_request_in_flight_leaves_nothing_unfinished(overlapped: LLM) -> None:
    engine = overlapped.engine
    params = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)
    engine.add_request("gone", PREFIX[:8], params)
    engine.step()  # queued, not read
    assert engine.abort("gone") and not engine.abort("gone")
    assert not engine.has_unfinished()  # the step in flight has nothing left to deliver
    assert engine.step() == []  # settles it quietly
    engine.scheduler.check_integrity()
    assert engine.scheduler.stats().num_used_blocks == 0
