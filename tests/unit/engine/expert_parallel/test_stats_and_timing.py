"""Expert load statistics and the step-time breakdown, on a real engine (a gang of one)."""

from __future__ import annotations

from engine import LLM, SamplingParams
from engine.expert_parallel import ExpertPlacement, InProcGroup, StepTimer, install_expert_parallel

PROMPTS = [[5, 80, 81, 82, 99, 7], [300, 12, 13]]
NEW_TOKENS = 5


def test_stats_count_every_routed_row_per_step_and_in_total() -> None:
    llm = LLM("builtin:tiny-moe", max_model_len=128, block_size=8)
    timer = StepTimer()
    ep_model = install_expert_parallel(
        llm.engine.parts.model,
        InProcGroup(1).member(0),
        ExpertPlacement.contiguous(8, 1),
        timer=timer,
    )
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)
    snap = ep_model.stats.snapshot()
    num_moe_layers, top_k = len(ep_model.layers), 2
    # One prefill step with every prompt token, then one decode step per further token.
    assert snap["num_steps"] == timer.num_steps == ep_model.num_forwards == NEW_TOKENS
    forward_tokens = sum(map(len, PROMPTS)) + (NEW_TOKENS - 1) * len(PROMPTS)
    assert sum(snap["total_tokens_per_expert"]) == forward_tokens * top_k * num_moe_layers
    assert snap["total_routed_tokens_per_expert"] == snap["total_tokens_per_expert"]
    assert sum(snap["step_tokens_per_expert"]) == len(PROMPTS) * top_k * num_moe_layers
    per_layer = snap["total_tokens_per_layer_expert"]
    assert len(per_layer) == num_moe_layers
    assert [sum(row) for row in per_layer] == [forward_tokens * top_k] * num_moe_layers
    loads = snap["total_tokens_per_expert"]
    assert snap["load_imbalance"] == max(loads) / (sum(loads) / len(loads))
    assert snap["total_all_to_all_bytes"] == 0  # a gang of one sends nothing

    times = timer.snapshot()
    assert times["num_steps"] == NEW_TOKENS
    total = times["total_s"]
    moe_s = total["dispatch"] + total["experts"] + total["combine"]
    assert min(total.values()) > 0.0
    assert abs(total["attention"] + moe_s - total["forward"]) < 1e-6
    timer.reset()
    assert timer.snapshot()["total_s"]["forward"] == 0.0


def test_empty_forward_counts_a_step_with_no_tokens() -> None:
    llm = LLM("builtin:tiny-moe", max_model_len=128, block_size=8)
    ep_model = install_expert_parallel(
        llm.engine.parts.model, InProcGroup(1).member(0), ExpertPlacement.contiguous(8, 1)
    )
    ep_model.empty_forward()
    snap = ep_model.stats.snapshot()
    assert ep_model.num_forwards == snap["num_steps"] == 1
    assert sum(snap["total_tokens_per_expert"]) == 0
    assert snap["load_imbalance"] == 0.0
