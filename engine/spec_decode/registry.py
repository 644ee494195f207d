"""Which :class:`~engine.spec_decode.proposer.Proposer` a ``speculative.method`` names.

A registry of ``method -> "module:Class"``, each class constructed from the
:class:`~core.config.SpeculativeConfig`; the module is imported only when its method is chosen.
"""

from __future__ import annotations

import importlib
from typing import cast

from core.config import SpeculativeConfig
from core.errors import ConfigError
from engine.spec_decode.proposer import Proposer

PROPOSERS: dict[str, str] = {
    "ngram": "engine.spec_decode.ngram:NgramProposer",
    "suffix": "engine.spec_decode.suffix:SuffixProposer",
}
"""Every draft-free method and the class that drafts for it."""


def build_proposer(config: SpeculativeConfig) -> Proposer:
    """The proposer of ``config.method``; :class:`ConfigError` when this build has none."""
    target = PROPOSERS.get(config.method)
    if target is None:
        raise ConfigError(
            f"speculative method {config.method!r} has no proposer here "
            f"(available: {', '.join(sorted(PROPOSERS))})",
            param="speculative.method",
        )
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise ConfigError(
            f"speculative method {config.method!r} is not available in this build ({e})",
            param="speculative.method",
        ) from e
    return cast(Proposer, getattr(module, class_name)(config))
