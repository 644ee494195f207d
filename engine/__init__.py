"""The inference engine both roles run: models, paged KV, scheduler, sampler, offline API."""

from core.sampling import SamplingParams
from engine.engine import LLMEngine
from engine.llm import LLM
from engine.outputs import RequestOutput

__all__ = ["LLM", "LLMEngine", "RequestOutput", "SamplingParams"]
