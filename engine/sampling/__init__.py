"""Token sampling (greedy, temperature, top-k/top-p, seeds, logprobs) and stop-string matching."""

from engine.sampling.row import SamplingRow
from engine.sampling.sampler import Sampler, SamplerOutput, make_generator
from engine.sampling.stop import StopCheck, StopStringMatcher

__all__ = [
    "Sampler",
    "SamplerOutput",
    "SamplingRow",
    "StopCheck",
    "StopStringMatcher",
    "make_generator",
]
