"""What routers read from a request: block hashes, prompt length, session id."""

from __future__ import annotations

from cluster.routing.request_features import RequestFeatures, read_features
from core.hashing import hash_prompt_blocks
from core.messages import PrefillRequest

PROMPT = list(range(40))


def test_reads_the_ingress_keys_from_the_first_positional_dict() -> None:
    payload = PrefillRequest("r1", PROMPT, {"max_tokens": 4}).to_dict()
    payload.update(block_hashes=[5, 6], session_id="s")
    features = read_features([payload], {})
    assert features == RequestFeatures(block_hashes=(5, 6), num_prompt_tokens=40, session_id="s")
    assert read_features([], {"request": payload}) == features


def test_hashes_are_computed_when_missing_and_a_block_size_is_known() -> None:
    payload = {"prompt_token_ids": PROMPT}
    features = read_features([payload], {}, block_size=16, hash_seed=3)
    assert features.block_hashes == tuple(hash_prompt_blocks(PROMPT, 16, seed=3))
    assert read_features([payload], {}).block_hashes == ()


def test_session_falls_back_to_the_handle_option_and_odd_payloads_route_plainly() -> None:
    assert read_features([{"prompt_token_ids": [1]}], {}, fallback_session_id="h").session_id == "h"
    assert read_features(["text"], {}, fallback_session_id="") == RequestFeatures()
    assert read_features([{"block_hashes": "nope"}], {}) == RequestFeatures()
    assert read_features([{"block_hashes": [1, "x"]}], {}) == RequestFeatures()
    malformed = {"block_hashes": [None], "prompt_token_ids": PROMPT}
    assert read_features([malformed], {}, block_size=16).block_hashes == tuple(
        hash_prompt_blocks(PROMPT, 16)
    )
    assert read_features([{"prompt_token_ids": "text"}], {}, block_size=4) == RequestFeatures()
