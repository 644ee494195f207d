"""The adapter manager's residency: device slots and host memory, least recently used first."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from core.errors import InvalidRequestError
from engine import LLM, LoRARequest, SamplingParams
from engine.lora import Residency
from tests.unit.engine.lora.peft_adapters import MadeAdapter
from tests.unit.engine.models.hf_checkpoints import HFCheckpoint

GREEDY = SamplingParams(max_tokens=2, temperature=0.0)
D, H, C = Residency.DEVICE, Residency.HOST, Residency.COLD


def test_lru_between_device_host_and_disk(
    llama: HFCheckpoint, adapters: Callable[..., MadeAdapter]
) -> None:
    llm = LLM(str(llama.path), block_size=8, enable_lora=True, max_loras=2, max_cpu_loras=3)
    lora = llm.engine.parts.lora
    assert lora is not None
    requests = {
        name: LoRARequest(name, i + 1, str(adapters(i + 1).path)) for i, name in enumerate("abcd")
    }

    def run(name: str) -> None:
        llm.generate(
            prompt_token_ids=[[1, 2, 3]],
            sampling_params=GREEDY,
            lora_request=requests[name],
            use_tqdm=False,
        )

    for name in "abc":
        llm.engine.add_lora(requests[name])
    assert lora.residencies() == {"a": H, "b": H, "c": H}
    run("a")
    run("b")
    assert lora.residencies() == {"a": D, "b": D, "c": H}
    run("c")  # two device slots: a, the least recent, goes back to host only
    assert lora.residencies() == {"a": H, "b": D, "c": D}
    llm.engine.add_lora(requests["d"])  # host full: the least recent without a slot leaves
    assert lora.residencies() == {"b": D, "c": D, "d": H}
    assert lora.residency("a") is C
    run("a")  # back from disk: d (host only) leaves host, b (least recent slot) the device
    assert lora.residencies() == {"a": D, "b": H, "c": D}
    assert lora.residency("d") is C


def test_unload_is_refused_while_requests_run(
    llama: HFCheckpoint, adapters: Callable[..., MadeAdapter]
) -> None:
    llm = LLM(str(llama.path), block_size=8, enable_lora=True)
    lora = llm.engine.parts.lora
    assert lora is not None
    request = LoRARequest("a", 1, str(adapters(1).path))
    llm.engine.add_request("r1", [1, 2, 3], GREEDY, lora_request=request)
    assert lora.adapter_of("r1") == "a"
    with pytest.raises(InvalidRequestError, match="in use by 1 request"):
        lora.remove_adapter("a")
    while llm.engine.has_unfinished():
        llm.engine.step()
    assert lora.adapter_of("r1") is None
    assert lora.remove_adapter("a")
    assert lora.residency("a") is C
    assert not lora.remove_adapter("a")


def test_the_scheduler_runs_at_most_max_loras_adapters(
    llama: HFCheckpoint, adapters: Callable[..., MadeAdapter]
) -> None:
    llm = LLM(str(llama.path), block_size=8, enable_lora=True, max_loras=2, max_cpu_loras=3)
    params = SamplingParams(max_tokens=4, temperature=0.0)
    for i in range(3):
        request = LoRARequest(f"a{i}", i + 1, str(adapters(i + 1).path))
        llm.engine.add_request(f"r{i}", [1, 2, 3], params, lora_request=request)
    llm.engine.add_request("base", [1, 2, 3], params)  # the base needs no slot
    llm.engine.step()
    stats = llm.engine.scheduler.stats()
    assert (stats.num_running, stats.num_waiting) == (2, 2)  # r2 waits, and base behind it
    while llm.engine.has_unfinished():
        llm.engine.step()
    llm.engine.scheduler.check_integrity()
