"""``RequestOutput.metrics``: when the engine added a request, first batched it and sampled its
first token; queue and prefill time follow from them, and a request that waits behind a full
batch shows the wait as queue time."""

from __future__ import annotations

from core.config import EngineConfig, ModelConfig
from engine import LLMEngine, SamplingParams
from engine.outputs import RequestOutput
from engine.setup import build_engine_parts


def test_metrics_order_and_queue_time() -> None:
    config = EngineConfig(max_model_len=128, kv_cache_memory_bytes=4 << 20, max_num_seqs=1)
    engine = LLMEngine(build_engine_parts(ModelConfig(name="builtin:tiny-llama"), config))
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    engine.add_request("a", [1, 2, 3, 4, 5], params)
    engine.add_request("b", [6, 7, 8], params)
    last: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        for output in engine.step():
            last[output.request_id] = output
    first, second = last["a"].metrics, last["b"].metrics
    assert first is not None and second is not None
    for m in (first, second):
        assert m.first_scheduled_time is not None and m.first_token_time is not None
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time
        assert m.time_in_queue >= 0.0 and m.prefill_time > 0.0
    # max_num_seqs=1: b waits until a finished
    assert second.first_scheduled_time >= first.first_token_time  # type: ignore[operator]
    assert second.time_in_queue > first.time_in_queue
    times = second.stage_times()
    assert (times.queue_s, times.prefill_s) == (second.time_in_queue, second.prefill_time)
