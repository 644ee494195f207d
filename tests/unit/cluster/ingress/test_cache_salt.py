"""Cache salts at the ingress: a body's ``cache_salt`` and the per-API-key tenant salt enter the
prompt's block hashes and travel to both pools, so no router predicts a hit across salts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from cluster.ingress.openai.prompts import combined_salt
from core.config import ServerConfig
from core.hashing import hash_prompt_blocks
from engine.tokenizer import Tokenizer
from tests.unit.cluster.ingress.fakes import Harness, run

LONG = "hello world, this is a long prompt"  # over the local-prefill threshold: remote


def post(h: Harness, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    headers = {} if key is None else {"authorization": f"Bearer {key}"}

    async def go() -> httpx.Response:
        async with h.client(**headers) as client:
            return await client.post("/v1/completions", json=body)

    return run(go())


def test_a_body_salt_enters_the_hashes_of_both_pools(
    make_harness: Callable[..., Harness], tokenizer: Tokenizer
) -> None:
    h = make_harness()
    assert post(h, {"prompt": LONG, "max_tokens": 2, "cache_salt": "s1"}).status_code == 200
    assert post(h, {"prompt": LONG, "max_tokens": 2}).status_code == 200
    salted, plain = h.prefill.requests[0].routing, h.prefill.requests[1].routing
    ids = tokenizer.encode(LONG)
    assert salted.cache_salt == "s1" and plain.cache_salt is None
    assert list(salted.block_hashes) == hash_prompt_blocks(ids, 4, seed=0, salt="s1")
    assert list(plain.block_hashes) == hash_prompt_blocks(ids, 4, seed=0)
    assert h.decode.requests[0].routing == salted
    bad = post(h, {"prompt": LONG, "cache_salt": ""})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache_salt"


def test_each_api_key_is_its_own_tenant(make_harness: Callable[..., Harness]) -> None:
    h = make_harness(api_keys=frozenset({"k1", "k2"}), cache_salt_per_api_key=True)
    for key in ("k1", "k2", "k1"):
        assert post(h, {"prompt": LONG, "max_tokens": 2}, key).status_code == 200
    one, two, again = (r.routing for r in h.prefill.requests)
    assert one.cache_salt and two.cache_salt and one.cache_salt != two.cache_salt
    assert one == again
    assert "k1" not in one.cache_salt  # a digest of the key, never the key
    assert post(h, {"prompt": LONG, "max_tokens": 2, "cache_salt": "x"}, "k1").status_code == 200
    assert h.prefill.requests[-1].routing.cache_salt == f"{one.cache_salt}/x"


def test_salt_composition_and_config_rules() -> None:
    assert combined_salt(None, None) is None
    assert combined_salt("t", None) == "t" and combined_salt(None, "r") == "r"
    assert combined_salt("t", "r") == "t/r"
    with pytest.raises(ValueError, match="needs API keys"):
        ServerConfig(cache_salt_per_api_key=True)
    assert ServerConfig(cache_salt_per_api_key=True, api_keys_env="KEYS").cache_salt_per_api_key
