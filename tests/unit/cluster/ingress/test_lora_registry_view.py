"""Every ingress replica follows the cluster's LoRA registry: an adapter loaded or unloaded
through one ingress is served (and listed) or 404s on another, and on an app rebuilt later (an
in-place reconfigure, a restarted ingress), without a registry read on base-model requests; a
runtime load attaches to ``base_model_name``'s model, else the only LoRA model, else a 400."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest

from cluster.ingress import create_app
from cluster.ingress.lora_adapters import ServedAdapter
from cluster.ingress.model_table import ModelEndpoint
from core.errors import UnavailableError
from engine.tokenizer import Tokenizer
from tests.unit.cluster.ingress.fakes import MODEL, FakeDecode, FakePrefill, settings_with
from tests.unit.cluster.ingress.test_lora_routes import FakeLoRAAdmin, call, complete

pytestmark = pytest.mark.timeout(30)

LOAD = "/v1/load_lora_adapter"


def ingress(
    tokenizer: Tokenizer, admin: FakeLoRAAdmin, decode: FakeDecode | None = None
) -> httpx.ASGITransport:
    """One ingress replica over ``admin``'s registry."""
    endpoint = ModelEndpoint(tokenizer, FakePrefill(), decode or FakeDecode(), settings_with())
    return httpx.ASGITransport(app=create_app([endpoint], lora_admin=admin).asgi)


def listed(app: httpx.ASGITransport) -> list[str]:
    return [m["id"] for m in call(app, "GET", "/v1/models").json()["data"]]


def test_a_load_through_one_ingress_is_served_and_listed_on_another(tokenizer: Tokenizer) -> None:
    admin, decode = FakeLoRAAdmin(), FakeDecode()
    first, second = ingress(tokenizer, admin), ingress(tokenizer, admin, decode)
    assert complete(second, "chat").status_code == 404
    body = {"lora_name": "chat", "lora_path": "/adapters/chat"}
    assert call(first, "POST", LOAD, body).status_code == 200
    answer = complete(second, "chat")
    assert answer.status_code == 200 and answer.json()["model"] == "chat"
    assert decode.requests[-1].routing.lora_name == "chat"
    assert listed(second) == [MODEL, "chat"]
    again = call(second, "POST", LOAD, body)
    assert again.status_code == 400 and "already been loaded" in again.text


def test_an_unload_through_one_ingress_404s_on_another(tokenizer: Tokenizer) -> None:
    admin = FakeLoRAAdmin()
    first, second = ingress(tokenizer, admin), ingress(tokenizer, admin)
    call(first, "POST", LOAD, {"lora_name": "chat", "lora_path": "/adapters/chat"})
    assert complete(second, "chat").status_code == 200  # second now knows it
    gone = call(first, "POST", "/v1/unload_lora_adapter", {"lora_name": "chat"})
    assert gone.status_code == 200
    missing = complete(second, "chat")
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"
    assert listed(second) == [MODEL]


def test_an_app_built_after_the_load_knows_it(tokenizer: Tokenizer) -> None:
    """What an in-place reconfigure or a restarted ingress builds: a fresh app, same registry."""
    admin = FakeLoRAAdmin()
    call(ingress(tokenizer, admin), "POST", LOAD, {"lora_name": "sql", "lora_path": "/a/sql"})
    rebuilt = ingress(tokenizer, admin)
    assert listed(rebuilt) == [MODEL, "sql"]
    assert complete(rebuilt, "sql").status_code == 200


def test_base_model_requests_and_fresh_views_do_not_read_the_registry(
    tokenizer: Tokenizer,
) -> None:
    admin = FakeLoRAAdmin(max_age_s=3600.0)
    app = ingress(tokenizer, admin)
    assert complete(app, MODEL).status_code == 200
    assert admin.num_reads == 0
    admin.board["chat"] = ServedAdapter("chat", MODEL, "/a/chat")
    assert complete(app, "chat").status_code == 200  # unknown here: read once
    assert complete(app, "chat").status_code == 200  # known, view fresh: no read
    assert listed(app) == [MODEL, "chat"]  # fresh: no read
    assert complete(app, MODEL).status_code == 200
    assert admin.num_reads == 1


class DownAdmin(FakeLoRAAdmin):
    """A registry that stops answering once ``down`` is set."""

    down = False

    async def registered(self) -> list[ServedAdapter]:
        if self.down:
            raise UnavailableError("the LoRA registry (stats board) did not answer")
        return await super().registered()


def test_an_unreadable_registry_keeps_the_last_view(tokenizer: Tokenizer) -> None:
    admin = DownAdmin()
    app = ingress(tokenizer, admin)
    admin.board["chat"] = ServedAdapter("chat", MODEL, "/a/chat")
    assert complete(app, "chat").status_code == 200
    admin.down = True
    assert complete(app, "chat").status_code == 200
    assert listed(app) == [MODEL, "chat"]
    assert complete(app, "other").status_code == 404


class TwoLoRAModels:
    """An ingress serving ``small`` (the first) and ``large``, both taking adapters."""

    def __init__(self, tokenizer: Tokenizer, bases: tuple[str, ...]) -> None:
        self.small, self.large = FakeDecode(), FakeDecode()
        self.admin = FakeLoRAAdmin(bases=bases)
        endpoints = [
            ModelEndpoint(
                tokenizer, FakePrefill(), decode, replace(settings_with(), served_model_names=names)
            )
            for decode, names in ((self.small, ("small",)), (self.large, ("large", "org/large")))
        ]
        app = create_app(endpoints, lora_admin=self.admin)
        self.app = httpx.ASGITransport(app=app.asgi)


def test_a_runtime_load_attaches_to_the_named_base(tokenizer: Tokenizer) -> None:
    two = TwoLoRAModels(tokenizer, ("small", "large"))
    body = {"lora_name": "sql", "lora_path": "/a/sql", "base_model_name": "org/large"}
    assert call(two.app, "POST", LOAD, body).status_code == 200
    assert two.admin.board["sql"] == ServedAdapter("sql", "large", "/a/sql")
    (entry,) = [m for m in call(two.app, "GET", "/v1/models").json()["data"] if m["id"] == "sql"]
    assert entry["parent"] == "large"
    assert complete(two.app, "sql").status_code == 200
    assert [r.routing.lora_name for r in two.large.requests] == ["sql"]
    assert two.small.requests == []


def test_without_a_base_several_lora_models_are_a_400_naming_them(tokenizer: Tokenizer) -> None:
    two = TwoLoRAModels(tokenizer, ("small", "large"))
    refused = call(two.app, "POST", LOAD, {"lora_name": "sql", "lora_path": "/a/sql"})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "base_model_name"
    assert error["message"] == (
        "several models serve LoRA adapters, name one as base_model_name: small, large"
    )
    assert two.admin.calls == []


def test_without_a_base_the_only_lora_model_takes_it(tokenizer: Tokenizer) -> None:
    two = TwoLoRAModels(tokenizer, ("large",))
    loaded = call(two.app, "POST", LOAD, {"lora_name": "sql", "lora_path": "/a/sql"})
    assert loaded.status_code == 200
    assert two.admin.board["sql"].base == "large"
    body = {"lora_name": "x", "lora_path": "/a/x", "base_model_name": "small"}
    refused = call(two.app, "POST", LOAD, body)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        "base_model_name 'small' is not a model serving LoRA adapters; choose one of: large"
    )
