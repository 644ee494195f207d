"""Built-in ``--dataset-name`` workloads beyond ``random``, as validated config sections.

- ``long-32k`` / ``long-128k``: long-context traffic, prompt lengths lognormal with a median of
  a quarter of the ceiling (8K / 32K), clipped to [1K, 32K] / [4K, 128K]; short outputs
  (uniform 64..192 tokens), the shape of RAG and document-QA traffic.
- ``long-short-mix``: every tenth request long (8K..24K-token prompt, 16 tokens out) among
  short ones (128..384-token prompts, 48..80 tokens out): the summary's ``interference``
  section compares the short requests' TTFT and ITL while long prompts prefill with the rest.
- ``shared-prefix``: 8 system prompts of 2K tokens shared by users sending 256-token questions.
- ``multi-turn``: 4-turn chats carrying their history, 1 s mean think time.
- ``mooncake-trace`` needs ``--dataset-path``; ``random`` is configured by the ``--random-*``
  flags (vLLM's).
"""

from __future__ import annotations

from typing import Any

from core.errors import ConfigError

_SHORT_OUTPUT = {"distribution": "uniform", "tokens": 128, "range_ratio": 0.5}

PRESET_WORKLOADS: dict[str, dict[str, Any]] = {
    "long-32k": {
        "kind": "random",
        "input_len": {
            "distribution": "lognormal",
            "tokens": 8192,
            "sigma": 0.8,
            "min_tokens": 1024,
            "max_tokens": 32768,
        },
        "output_len": _SHORT_OUTPUT,
    },
    "long-128k": {
        "kind": "random",
        "input_len": {
            "distribution": "lognormal",
            "tokens": 32768,
            "sigma": 0.8,
            "min_tokens": 4096,
            "max_tokens": 131072,
        },
        "output_len": _SHORT_OUTPUT,
    },
    "long-short-mix": {
        "kind": "long-short-mix",
        "long_fraction": 0.1,
        "long_input_len": {"distribution": "uniform", "tokens": 16384, "range_ratio": 0.5},
        "long_output_len": {"distribution": "fixed", "tokens": 16},
        "short_input_len": {"distribution": "uniform", "tokens": 256, "range_ratio": 0.5},
        "short_output_len": {"distribution": "uniform", "tokens": 64, "range_ratio": 0.25},
    },
    "shared-prefix": {
        "kind": "shared-prefix",
        "num_groups": 8,
        "prefix_len_tokens": 2048,
        "suffix_len": {"distribution": "uniform", "tokens": 256, "range_ratio": 0.25},
        "output_len": {"distribution": "uniform", "tokens": 128, "range_ratio": 0.25},
    },
    "multi-turn": {"kind": "multi-turn"},
}
DATASET_NAMES = ("random", *PRESET_WORKLOADS, "mooncake-trace")


def preset_workload(name: str) -> dict[str, Any]:
    """The workload section for dataset ``name`` (a copy); ConfigError listing the names."""
    if name not in PRESET_WORKLOADS:
        raise ConfigError(
            f"unknown --dataset-name {name!r}; choose one of: {', '.join(DATASET_NAMES)}",
            param="dataset_name",
        )
    return dict(PRESET_WORKLOADS[name])
