"""The inference engine both roles run: models, paged KV, scheduler, sampler, offline API.

The top-level names load lazily, so ``import engine.tokenizer`` (the ingress needs only the
tokenizer) does not pull in torch and the model code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.sampling import SamplingParams
    from engine.engine import LLMEngine
    from engine.llm import LLM
    from engine.lora.request import LoRARequest
    from engine.outputs import CompletionOutput, Logprob, RequestOutput

__all__ = [
    "LLM",
    "CompletionOutput",
    "LLMEngine",
    "LoRARequest",
    "Logprob",
    "RequestOutput",
    "SamplingParams",
]

_HOMES = {
    "LLM": "engine.llm",
    "LLMEngine": "engine.engine",
    "LoRARequest": "engine.lora.request",
    "CompletionOutput": "engine.outputs",
    "Logprob": "engine.outputs",
    "RequestOutput": "engine.outputs",
    "SamplingParams": "core.sampling",
}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
