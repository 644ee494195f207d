"""Token sampling (greedy, temperature, top-k/top-p, seeds, logprobs), the rejection sampling of
speculative drafts, and stop-string matching."""

from engine.sampling.rejection import DraftedRequest, RejectionSampler, VerifiedTokens
from engine.sampling.row import SamplingRow
from engine.sampling.sampler import Sampler, SamplerOutput, make_generator
from engine.sampling.stop_strings import StopCheck, StopStringMatcher

__all__ = [
    "DraftedRequest",
    "RejectionSampler",
    "Sampler",
    "SamplerOutput",
    "SamplingRow",
    "StopCheck",
    "StopStringMatcher",
    "VerifiedTokens",
    "make_generator",
]
