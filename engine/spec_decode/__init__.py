"""Speculative decoding: draft proposers and the acceptance of drafted tokens."""

from engine.spec_decode.ngram import NgramProposer
from engine.spec_decode.proposer import Proposer

__all__ = ["NgramProposer", "Proposer"]
