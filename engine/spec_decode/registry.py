"""Which :class:`~engine.spec_decode.proposer.Proposer` a ``speculative.method`` names.

A registry of ``method -> builder``; each builder constructs its proposer from the
:class:`~core.config.SpeculativeConfig`, importing the proposer's module only when its method is
chosen (``suffix`` is imported by name, so a build without it refuses the method in one line).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import cast

from core.config import SpeculativeConfig
from core.errors import ConfigError
from engine.spec_decode.ngram import NgramProposer
from engine.spec_decode.proposer import Proposer


def _ngram(config: SpeculativeConfig) -> Proposer:
    return NgramProposer(config)


def _suffix(config: SpeculativeConfig) -> Proposer:
    proposer_class = _import("engine.spec_decode.suffix", "SuffixProposer", config.method)
    return cast(
        Proposer,
        proposer_class(
            max_tree_depth=config.suffix_decoding_max_tree_depth,
            max_cached_requests=config.suffix_decoding_max_cached_requests,
            max_spec_factor=config.suffix_decoding_max_spec_factor,
            min_token_prob=config.suffix_decoding_min_token_prob,
        ),
    )


PROPOSERS: dict[str, Callable[[SpeculativeConfig], Proposer]] = {
    "ngram": _ngram,
    "suffix": _suffix,
}
"""Every draft-free method and what builds its proposer."""


def build_proposer(config: SpeculativeConfig) -> Proposer:
    """The proposer of ``config.method``; :class:`ConfigError` when this build has none."""
    builder = PROPOSERS.get(config.method)
    if builder is None:
        raise ConfigError(
            f"speculative method {config.method!r} has no proposer here "
            f"(available: {', '.join(sorted(PROPOSERS))})",
            param="speculative.method",
        )
    return builder(config)


def _import(module_name: str, class_name: str, method: str) -> Callable[..., object]:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ConfigError(
            f"speculative method {method!r} is not available in this build ({e})",
            param="speculative.method",
        ) from e
    return cast(Callable[..., object], getattr(module, class_name))
