"""Speculative decoding: draft proposers and the acceptance of drafted tokens."""

from engine.spec_decode.draft_length import DraftLengths
from engine.spec_decode.ngram import NgramProposer
from engine.spec_decode.payoff import DraftPayoff
from engine.spec_decode.proposer import BatchProposer, DraftQuery, EachRequest, Proposer
from engine.spec_decode.registry import PROPOSERS, build_proposer
from engine.spec_decode.step_costs import StepCostFit, StepCosts

__all__ = [
    "PROPOSERS",
    "BatchProposer",
    "DraftLengths",
    "DraftPayoff",
    "DraftQuery",
    "EachRequest",
    "NgramProposer",
    "Proposer",
    "StepCostFit",
    "StepCosts",
    "build_proposer",
]
