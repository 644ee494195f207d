"""Draw token lengths from a ``LengthConfig`` (fixed, vLLM-style uniform, or lognormal)."""

from __future__ import annotations

import numpy as np

from loadtest.config import LengthConfig


def sample_length(config: LengthConfig, rng: np.random.Generator) -> int:
    """One draw, clipped to ``[min_tokens, max_tokens]``.

    uniform follows vLLM's ``--random-range-ratio``: an integer in
    ``[floor(tokens*(1-r)), ceil(tokens*(1+r))]``; lognormal has median ``tokens`` and
    ``ln``-space standard deviation ``sigma``.
    """
    if config.distribution == "fixed":
        value = config.tokens
    elif config.distribution == "uniform":
        low = int(np.floor(config.tokens * (1.0 - config.range_ratio)))
        high = int(np.ceil(config.tokens * (1.0 + config.range_ratio)))
        value = int(rng.integers(low, high + 1))
    else:
        value = round(float(rng.lognormal(mean=np.log(config.tokens), sigma=config.sigma)))
    upper = config.max_tokens if config.max_tokens is not None else value
    return max(config.min_tokens, min(value, upper))
