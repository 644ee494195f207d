"""What routers read from a request: the RoutingKeys the ingress put in it."""

from __future__ import annotations

import pytest

from cluster.routing.request_features import read_routing_keys
from core.codec import to_plain
from core.messages import DecodeRequest, PrefillRequest, RoutingKeys
from core.sampling import SamplingParams

PROMPT = list(range(40))
KEYS = RoutingKeys(block_hashes=(5, 6), num_prompt_tokens=40, session_id="s")


@pytest.mark.parametrize("kind", [PrefillRequest, DecodeRequest])
def test_reads_the_routing_field_of_either_message(kind: type) -> None:
    payload = to_plain(kind("r1", PROMPT, SamplingParams(max_tokens=4), KEYS))
    assert read_routing_keys([payload], {}) == KEYS
    assert read_routing_keys([], {"request": payload}) == KEYS


def test_serve_session_id_fills_in_only_when_the_keys_have_none() -> None:
    plain = to_plain(PrefillRequest("r1", PROMPT, SamplingParams(), RoutingKeys((1,), 40)))
    assert read_routing_keys([plain], {}, fallback_session_id="h").session_id == "h"
    with_session = to_plain(PrefillRequest("r2", PROMPT, SamplingParams(), KEYS))
    assert read_routing_keys([with_session], {}, fallback_session_id="h").session_id == "s"


def test_calls_without_a_readable_message_route_without_a_prefix() -> None:
    assert read_routing_keys(["text"], {}, fallback_session_id="") == RoutingKeys()
    assert read_routing_keys([{"prompt_token_ids": [1]}], {}) == RoutingKeys()
    bad = {"routing": {"block_hashes": [1, "x"], "num_prompt_tokens": 3, "session_id": None}}
    assert read_routing_keys([bad], {}, fallback_session_id="h") == RoutingKeys(session_id="h")
