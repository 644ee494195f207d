"""``pdserve bench`` against a server shaped like llama-cpp-python's: request ids must be UUIDs
(anything else gets an empty 400), no ``/tokenize``, no usage in the stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import httpx
from typer.testing import CliRunner

from cluster.ops.cli import app
from loadtest.config import LoadTestTargetConfig
from loadtest.failures import failure_reasons, reason_line
from loadtest.gguf_tokenizer import read_gguf_tokenizer
from loadtest.http_client import OpenAIStreamClient
from loadtest.types import FailureKind, RequestRecord, StreamOutcome
from tests.unit.loadtest.fake_server import FakeBehaviour

runner = CliRunner()
ENV = {"COLUMNS": "200"}
EMPTY_400 = "empty body (HTTP/1.1 400 Bad Request); server: uvicorn; content-length: 0"


def llama_cpp_like() -> FakeBehaviour:
    return FakeBehaviour(ttft_s=0.002, itl_s=0.001, uuid_request_ids=True, include_usage=False)


def test_bench_against_a_server_that_takes_only_uuid_request_ids(
    fake_server: Callable, gpt2_gguf: Path, tmp_path: Path
) -> None:
    server, url = fake_server(llama_cpp_like())
    args = ["bench", "--base-url", url, "--no-progress", "--seed", "1", "--num-prompts", "6"]
    args += ["--random-input-len", "40", "--random-output-len", "4", "--tokenizer", str(gpt2_gguf)]
    args += ["--save-result", "--result-dir", str(tmp_path), "--result-filename", "r.json"]
    result = runner.invoke(app, [*args, "--no-plots"], env=ENV)
    assert result.exit_code == 0, result.output
    assert server.refused_request_ids == [] and len(server.received) == 6
    summary = json.loads((tmp_path / "r.json").read_text())
    assert (summary["completed"], summary["failed"]) == (6, 0)
    assert (summary["token_counts"], summary["tokenizer_id"]) == ("tokenizer", str(gpt2_gguf))
    tokenizer = read_gguf_tokenizer(gpt2_gguf)  # the prompts are exactly as long as planned
    lengths = {
        len(tokenizer.encode(r.prompt_text, add_special_tokens=False)) for r in server.received
    }
    assert lengths == {40}


def test_an_empty_error_body_is_reported_by_its_status_line_and_headers(
    fake_server: Callable,
) -> None:
    server, url = fake_server(llama_cpp_like())

    async def send(request_id: str) -> StreamOutcome:
        async with httpx.AsyncClient(timeout=10) as http:
            client = OpenAIStreamClient(http, LoadTestTargetConfig(base_url=url), "m")
            return await client.stream("hello there", 4, request_id)

    outcome = asyncio.run(send("bench-1a2b-0-0"))  # what the load tester used to send
    assert (outcome.failure_kind, outcome.http_status) == (FailureKind.HTTP_STATUS, 400)
    assert outcome.error == EMPTY_400  # no date: only the headers that could explain it
    assert server.refused_request_ids == ["bench-1a2b-0-0"]
    record = RequestRecord(
        request_id="r", session_id=0, turn_index=0, success=False, start_s=0.0, queue_s=0.0,
        prompt_tokens=1, output_tokens=0, ttft_s=0.0, latency_s=0.0,
        failure_kind=outcome.failure_kind, error=outcome.error, http_status=400,
    )  # fmt: skip
    (reason,) = failure_reasons([record, record])
    assert reason_line(reason) == f"2 × HTTP 400: {EMPTY_400}"
