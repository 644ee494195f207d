"""Chained block hashes: deterministic, prefix-chained, full blocks only."""

from __future__ import annotations

import subprocess
import sys

import pytest

from core.hashing import hash_block, hash_prompt_blocks, root_hash


def test_full_blocks_only_and_prefix_chaining() -> None:
    tokens = list(range(37))
    hashes = hash_prompt_blocks(tokens, 16)
    assert len(hashes) == 2  # 37 tokens -> 2 full blocks, the tail has no hash
    assert hashes[0] == hash_block(root_hash(), tokens[:16])
    assert hashes[1] == hash_block(hashes[0], tokens[16:32])
    # Same second block after a different first block -> different hash (the chain covers all).
    other = [99, *tokens[1:]]
    assert hash_prompt_blocks(other, 16)[1] != hashes[1]
    # A shared prefix shares hashes exactly as far as the blocks agree.
    diverging = tokens[:20] + [500] * 17
    assert hash_prompt_blocks(diverging, 16)[0] == hashes[0]
    assert hash_prompt_blocks(diverging, 16)[1] != hashes[1]


def test_seed_and_extra_keys_separate_caches() -> None:
    tokens = list(range(16))
    base = hash_prompt_blocks(tokens, 16)
    assert hash_prompt_blocks(tokens, 16, seed=1) != base
    assert hash_prompt_blocks(tokens, 16, extra_keys=("lora-a",)) != base
    with pytest.raises(ValueError, match="block_size"):
        hash_prompt_blocks(tokens, 0)


def test_identical_across_processes() -> None:
    """Python's hash is salted per process; ours must not be."""
    code = "from core.hashing import hash_prompt_blocks; print(hash_prompt_blocks(range(64), 16))"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": str(seed)},
        ).stdout
        for seed in (1, 2)
    }
    assert len(outs) == 1
    assert outs.pop().strip() == str(hash_prompt_blocks(list(range(64)), 16))
