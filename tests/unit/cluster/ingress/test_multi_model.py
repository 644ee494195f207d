"""One ingress, two served models and virtual names: each request reaches the pools of the
model it names (or the one a rule or cascade picks), and everything says which model answered."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import httpx
import pytest

from cluster.ingress import create_app
from cluster.ingress.model_routing.router import (
    CASCADE_USAGE_HEADER,
    ROUTE_REASON_HEADER,
    ROUTED_MODEL_HEADER,
)
from cluster.ingress.model_table import ModelEndpoint
from core.config import VirtualModelConfig
from engine.tokenizer import Tokenizer
from tests.unit.cluster.ingress.fakes import (
    FakeDecode,
    FakePrefill,
    run,
    settings_with,
    sse_payloads,
)

AUTO = VirtualModelConfig.model_validate(
    {
        "name": "auto",
        "default": "small",
        "rules": [{"model": "large", "name": "hinted", "header": "x-tier", "header_value": "hard"}],
    }
)
CAREFUL = VirtualModelConfig.model_validate(
    {"name": "careful", "default": "small", "cascade": {"escalate_to": "large"}}
)


class TwoModels:
    """An app serving ``small`` and ``large`` over fakes (every short prompt stays local)."""

    def __init__(self, tokenizer: Tokenizer, small_finish: str = "length") -> None:
        self.small = FakeDecode(local_steps=[(115, "s")], finish_reason=small_finish)
        self.large = FakeDecode(local_steps=[(108, "L"), (108, "L")])
        endpoints = [
            ModelEndpoint(tokenizer, FakePrefill(), self.small, settings_with()),
            ModelEndpoint(
                tokenizer,
                FakePrefill(),
                self.large,
                replace(
                    settings_with(), served_model_names=("large", "org/large"), max_model_len=99
                ),
            ),
        ]
        endpoints[0] = replace(
            endpoints[0], settings=replace(settings_with(), served_model_names=("small",))
        )
        self.app = create_app(endpoints, virtual_models=[AUTO, CAREFUL])

    def post(self, body: dict[str, Any], path: str = "/v1/completions", **headers: str) -> Any:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app.asgi)
            async with httpx.AsyncClient(transport=transport, base_url="http://i") as client:
                return await client.post(path, json=body, headers=headers)

        return run(go())

    def get(self, path: str) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app.asgi)
            async with httpx.AsyncClient(transport=transport, base_url="http://i") as client:
                return await client.get(path)

        return run(go())


def ask(model: str | None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": "hi", "max_tokens": 2, **extra}
    return body if model is None else {"model": model, **body}


@pytest.fixture
def app(tokenizer: Tokenizer) -> TwoModels:
    return TwoModels(tokenizer)


def test_models_lists_served_and_virtual_names(app: TwoModels) -> None:
    listed = {m["id"]: m["max_model_len"] for m in app.get("/v1/models").json()["data"]}
    assert listed == {"small": 256, "large": 99, "org/large": 99, "auto": 99, "careful": 99}


@pytest.mark.parametrize(
    ("model", "answered"), [("small", "small"), ("large", "large"), ("org/large", "org/large")]
)
def test_a_request_reaches_only_its_models_pools(app: TwoModels, model: str, answered: str) -> None:
    response = app.post(ask(model))
    assert response.status_code == 200 and response.json()["model"] == answered
    served = app.large if "large" in model else app.small
    other = app.small if served is app.large else app.large
    assert len(served.requests) == 1 and not other.requests
    assert ROUTED_MODEL_HEADER not in response.headers


def test_no_model_means_the_first_and_an_unknown_one_is_a_404(app: TwoModels) -> None:
    assert app.post(ask(None)).json()["model"] == "small" and len(app.small.requests) == 1
    missing = app.post(ask("huge"))
    assert missing.status_code == 404
    error = missing.json()["error"]
    assert error["type"] == "not_found_error" and error["param"] == "model"
    assert "small, large, org/large, auto, careful" in error["message"]
    assert not app.large.requests


def test_metrics_are_labelled_by_model(app: TwoModels) -> None:
    app.post(ask("small"))
    app.post(ask("large"))
    text = app.get("/metrics").text
    for model, tokens in (("small", 1), ("large", 2)):
        line = f'pdserve:generation_tokens_total{{model_name="{model}",role="ingress"}} {tokens}.0'
        assert line in text


def test_a_rule_routes_auto_and_says_why(app: TwoModels) -> None:
    hard = app.post(ask("auto"), **{"X-Tier": "hard"})
    easy = app.post(ask("auto"))
    assert hard.json()["model"] == "large" and easy.json()["model"] == "small"
    assert hard.headers[ROUTED_MODEL_HEADER] == "large"
    assert (hard.headers[ROUTE_REASON_HEADER], easy.headers[ROUTE_REASON_HEADER]) == (
        "hinted",
        "default",
    )
    text = app.get("/metrics").text
    for model, reason in (("large", "hinted"), ("small", "default")):
        labels = f'model_name="{model}",reason="{reason}",virtual_model="auto"'
        assert f"pdserve:model_routing_decisions_total{{{labels}}} 1.0" in text


def test_a_cascade_escalates_a_cut_off_answer(app: TwoModels) -> None:
    response = app.post(ask("careful", stream=True), "/v1/chat/completions")
    assert response.status_code == 400  # chat needs messages: the cheap attempt's error
    body = {"model": "careful", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = app.post(body, "/v1/chat/completions")
    assert response.json()["model"] == "large"
    assert response.headers[ROUTE_REASON_HEADER] == "escalated_length"
    assert "model=small; prompt_tokens=" in response.headers[CASCADE_USAGE_HEADER]
    assert len(app.small.requests) == 1 and len(app.large.requests) == 1


def test_an_accepted_cascade_answer_is_replayed_as_the_stream_asked_for(
    tokenizer: Tokenizer,
) -> None:
    app = TwoModels(tokenizer, small_finish="stop")
    response = app.post(ask("careful", stream=True, stream_options={"include_usage": True}))
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_payloads(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["model"] for c in chunks} == {"small"}
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "s"
    assert chunks[-1]["usage"]["completion_tokens"] == 1
    assert response.headers[ROUTE_REASON_HEADER] == "cascade_accepted"
    assert not app.large.requests


def test_tokenize_uses_the_named_models_limits(app: TwoModels) -> None:
    assert app.post({"model": "large", "prompt": "hi"}, "/tokenize").json()["max_model_len"] == 99
    assert app.post({"prompt": "hi"}, "/tokenize").json()["max_model_len"] == 256
    assert app.post({"model": "huge", "prompt": "hi"}, "/tokenize").status_code == 404


def test_ready_reports_every_model(app: TwoModels) -> None:
    app.large.is_healthy = False
    response = app.get("/ready")
    assert response.status_code == 503
    body = response.json()
    assert body["models"]["large"] == {
        "prefill": True,
        "decode": False,
        "reason": "no decode replica is serving",
    }
    assert body["reason"] == "large: no decode replica is serving"
