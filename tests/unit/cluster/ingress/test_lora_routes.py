"""LoRA adapters at the ingress: a YAML adapter is listed in ``/v1/models`` with its base as
``parent`` and a request naming it runs on the base model's pools with ``lora_name`` set (its
block hashes salted); ``/v1/load_lora_adapter`` serves a new adapter once the cluster's admin
loaded it everywhere, a refusal is one OpenAI-shaped error and nothing is served; unload, then
the name is a 404."""

from __future__ import annotations

from typing import Any

import httpx

from cluster.ingress import create_app
from cluster.ingress.lora_adapters import ServedAdapter
from cluster.ingress.model_table import ModelEndpoint
from core.config.lora import LoRAModuleConfig
from core.errors import LoRARankError
from core.hashing import hash_prompt_blocks
from engine.tokenizer import Tokenizer
from tests.unit.cluster.ingress.fakes import MODEL, FakeDecode, FakePrefill, run, settings_with

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]  # 3 blocks of 4, above local prefill


class FakeLoRAAdmin:
    """The cluster's admin over one registry (the stats board's), read by every ingress."""

    def __init__(self, bases: tuple[str, ...] = (MODEL,), max_age_s: float = 0.0) -> None:
        self.calls: list[tuple[str, str]] = []
        self.board: dict[str, ServedAdapter] = {}
        self.bases = bases
        self.max_age_s = max_age_s
        self.num_reads = 0

    async def registered(self) -> list[ServedAdapter]:
        self.num_reads += 1
        return list(self.board.values())

    async def load(self, adapter: ServedAdapter) -> None:
        if "big" in adapter.path:
            raise LoRARankError(
                f"adapter {adapter.name!r} has rank 64 > max_lora_rank 16", param=adapter.name
            )
        self.calls.append(("load", adapter.name))
        self.board[adapter.name] = adapter

    async def unload(self, adapter: ServedAdapter) -> None:
        self.calls.append(("unload", adapter.name))
        self.board.pop(adapter.name, None)


def make_app(tokenizer: Tokenizer, admin: FakeLoRAAdmin) -> tuple[httpx.ASGITransport, FakeDecode]:
    decode = FakeDecode()
    modules = (LoRAModuleConfig(name="sql", path="/adapters/sql"),)
    endpoint = ModelEndpoint(tokenizer, FakePrefill(), decode, settings_with(lora_modules=modules))
    app = create_app([endpoint], lora_admin=admin)
    return httpx.ASGITransport(app=app.asgi), decode


def call(app: httpx.ASGITransport, method: str, path: str, body: Any = None) -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=app, base_url="http://ingress") as client:
            return await client.request(method, path, json=body)

    return run(go())


def complete(app: httpx.ASGITransport, model: str) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 2}
    return call(app, "POST", "/v1/completions", body)


def test_yaml_adapters_are_listed_and_served_on_the_base_pools(tokenizer: Tokenizer) -> None:
    app, decode = make_app(tokenizer, FakeLoRAAdmin())
    listed = call(app, "GET", "/v1/models").json()["data"]
    assert [m["id"] for m in listed] == [MODEL, "sql"]
    assert listed[1]["parent"] == MODEL and listed[1]["root"] == "/adapters/sql"
    answer = complete(app, "sql")
    assert answer.status_code == 200 and answer.json()["model"] == "sql"
    (request,) = decode.requests
    assert request.routing.lora_name == "sql"
    assert request.routing.block_hashes == tuple(hash_prompt_blocks(PROMPT, 4, lora_name="sql"))
    assert complete(app, MODEL).status_code == 200
    assert decode.requests[1].routing.lora_name is None


def test_load_serve_unload_then_404(tokenizer: Tokenizer) -> None:
    admin = FakeLoRAAdmin()
    app, decode = make_app(tokenizer, admin)
    body = {"lora_name": "chat", "lora_path": "/adapters/chat"}
    loaded = call(app, "POST", "/v1/load_lora_adapter", body)
    assert loaded.status_code == 200
    assert loaded.text == "Success: LoRA adapter 'chat' added successfully."
    assert "chat" in [m["id"] for m in call(app, "GET", "/v1/models").json()["data"]]
    assert complete(app, "chat").status_code == 200
    assert decode.requests[-1].routing.lora_name == "chat"
    again = call(app, "POST", "/v1/load_lora_adapter", body)
    assert again.status_code == 400
    assert again.json()["error"]["message"] == "The lora adapter 'chat' has already been loaded."
    gone = call(app, "POST", "/v1/unload_lora_adapter", {"lora_name": "chat"})
    assert gone.text == "Success: LoRA adapter 'chat' removed successfully."
    missing = complete(app, "chat")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    unknown = call(app, "POST", "/v1/unload_lora_adapter", {"lora_name": "chat"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["message"] == "The lora adapter 'chat' cannot be found."
    assert admin.calls == [("load", "chat"), ("unload", "chat")]


def test_a_refused_load_is_one_error_and_serves_nothing(tokenizer: Tokenizer) -> None:
    app, _ = make_app(tokenizer, FakeLoRAAdmin())
    body = {"lora_name": "huge", "lora_path": "/adapters/big"}
    refused = call(app, "POST", "/v1/load_lora_adapter", body)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["message"] == "adapter 'huge' has rank 64 > max_lora_rank 16"
    listed = call(app, "GET", "/v1/models")
    assert "huge" not in [m["id"] for m in listed.json()["data"]]
    bad = call(app, "POST", "/v1/load_lora_adapter", {"lora_name": "x"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "lora_path"
