"""A request made ready for the pools: prompt token ids, sampling parameters, routing keys.

The protocol handlers build one per choice (``cluster.ingress.openai.prompts``); the dispatch
floor runs it over prefill and decode.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from core.hashing import BlockHash
from core.messages import RoutingKeys
from core.sampling import SamplingParams, sequence_seed


@dataclass(frozen=True)
class PreparedPrompt:
    """A validated request, ready for the prefill/decode flow."""

    prompt_token_ids: list[int]
    sampling: SamplingParams
    routing: RoutingKeys
    """Block hashes and session id, carried by the requests to both pools."""
    prompt_text: str = ""
    """The prompt as text (what ``echo`` sends back)."""
    first_token_text: str = ""
    """With ``echo``: the first prompt token's text (the position without a logprob)."""

    def sample(self, index: int) -> PreparedPrompt:
        """The prompt for choice ``index`` of ``n``: a seeded request's choice ``i`` samples with
        ``seed + i`` (as ``LLM.generate`` does), so choices differ and each is reproducible."""
        seed = self.sampling.seed
        if index == 0 or seed is None:
            return self
        sampling = replace(self.sampling, seed=sequence_seed(seed, index))
        return replace(self, sampling=sampling)

    @property
    def num_prompt_tokens(self) -> int:
        """Tokens in the prompt."""
        return len(self.prompt_token_ids)

    @property
    def block_hashes(self) -> tuple[BlockHash, ...]:
        """Chained hashes of the prompt's full blocks (routing, disaggregation decision)."""
        return self.routing.block_hashes
