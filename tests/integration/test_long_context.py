"""Long-context load testing against live clusters, as a user runs it.

A long prompt completes on ``configs/local-long-context.yaml`` (started with ``pdserve up
--detach`` on free ports) and ``pdserve bench`` without ``--tokenizer`` builds it at the exact
length the server counts: ``make test`` sends 8K tokens (four times the default context, eight
1024-token prefill chunks, a remote prefill and a 16 MiB KV pull; seconds), ``make chaos`` also
the full 32K the config is sized for (~90 s on 2 cores; marker ``chaos_full``).

Against the shared test app, whose 2048-token context is configs/local.yaml's, the preflight
refuses a ``long-32k`` run with one line before any request goes out, and failed requests are
reported grouped, with the exit code saying whether anything succeeded.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from cluster.serve.config_file import REPO_CONFIGS
from tests.cluster_fixtures import ServingApp
from tests.integration.support import MAX_MODEL_LEN, pdserve_cli, repo_config_on_free_ports

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

LONG_PROMPT_TOKENS = 32768
"""The prompt length configs/local-long-context.yaml is sized for (its context: 32K + 2K)."""
_REQUEST_COUNTERS = re.compile(
    r"^pdserve:(requests_rejected|request_success|requests_failed)_total\{.*\} ([0-9.e+]+)$"
)


@pytest.fixture
def long_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """configs/local-long-context.yaml up on free ports: (endpoint, environment). Per test: each
    make target runs one long prompt, and its cluster is down before the next test starts."""
    tmp = tmp_path_factory.mktemp("long-context")
    path, env = repo_config_on_free_ports("local-long-context.yaml", tmp)
    up = pdserve_cli("up", str(path), "--detach", env=env)
    assert up.returncode == 0, up.stdout + up.stderr
    state = json.loads((tmp / "cache" / "run" / "pdserve.json").read_text())
    try:
        yield state["endpoint"], env
    finally:
        pdserve_cli("down", env=env)


def bench(endpoint: str, out_dir: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    """``pdserve bench`` against ``endpoint``, results saved as ``out_dir/r.json``."""
    common = ["bench", "--base-url", endpoint, "--no-progress", "--no-plots", "--seed", "0"]
    common += ["--save-result", "--result-dir", str(out_dir), "--result-filename", "r.json"]
    return pdserve_cli(*common, *args, env=env)


@pytest.mark.parametrize(
    "prompt_tokens", [8192, pytest.param(LONG_PROMPT_TOKENS, marks=pytest.mark.chaos_full)]
)
def test_a_long_prompt_completes_at_the_length_the_server_counts(
    long_context: tuple[str, dict[str, str]], tmp_path: Path, prompt_tokens: int
) -> None:
    endpoint, env = long_context
    models = httpx.get(f"{endpoint}/v1/models", timeout=30).json()["data"]
    assert models[0]["max_model_len"] >= LONG_PROMPT_TOKENS
    started = time.monotonic()
    result = bench(
        endpoint,
        tmp_path,
        "--random-input-len", str(prompt_tokens), "--random-output-len", "4",
        "--num-prompts", "1",
        env=env,
    )  # fmt: skip
    wall_s = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((tmp_path / "r.json").read_text())
    assert summary["completed"] == 1 and summary["token_counts"] == "server"
    (record,) = [json.loads(line) for line in (tmp_path / "r.requests.jsonl").open()]
    assert record["prompt_token_source"] == "usage" and record["output_tokens"] == 4
    server, planned = record["prompt_tokens"], record["expected_prompt_tokens"]
    assert abs(planned - server) <= 0.01 * server, (planned, server)
    assert server == prompt_tokens  # the server's count is exactly what was asked for
    print(f"{prompt_tokens}-token prompt: TTFT {record['ttft_s']:.1f} s, bench wall {wall_s:.1f} s")


def request_count(app: ServingApp) -> float:
    """Generation requests the ingress has seen end (succeeded, failed or rejected)."""
    text = httpx.get(app.url("/metrics"), timeout=30).text
    matches = (_REQUEST_COUNTERS.match(line) for line in text.splitlines())
    return sum(float(m.group(2)) for m in matches if m)


def test_preflight_refuses_long_32k_on_a_2k_context_sending_nothing(
    app: ServingApp, tmp_path: Path
) -> None:
    local = yaml.safe_load((REPO_CONFIGS / "local.yaml").read_text())
    assert local["engine"]["max_model_len"] == MAX_MODEL_LEN  # the shared app stands for it
    before = request_count(app)
    result = bench(app.endpoint, tmp_path, "--dataset-name", "long-32k", "--num-prompts", "2")
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = [ln for ln in result.stderr.splitlines() if ln.startswith("error:")]
    assert line.startswith("error: preflight: the workload's largest request needs ")
    assert f"max_model_len is {MAX_MODEL_LEN:,}" in line
    assert "--random-input-len" in line and "configs/local-long-context.yaml" in line
    assert request_count(app) == before
    assert not (tmp_path / "r.json").exists()


def test_every_request_failing_prints_grouped_reasons_and_exits_1(
    app: ServingApp, tmp_path: Path
) -> None:
    args = ("--dataset-name", "long-32k", "--num-prompts", "2", "--no-preflight")
    result = bench(app.endpoint, tmp_path, *args)
    assert result.returncode == 1, result.stdout + result.stderr
    grouped = [ln.strip() for ln in result.stdout.splitlines() if re.match(r"\s*\d+ × ", ln)]
    assert len(grouped) == 1, result.stdout
    assert grouped[0].startswith(
        f"2 × HTTP 400: this model's maximum context length is {MAX_MODEL_LEN} tokens"
    )
    assert "error: no request succeeded" in result.stderr.splitlines()[-1]
    reasons = json.loads((tmp_path / "r.json").read_text())["failure_reasons"]
    assert [(r["count"], r["http_status"]) for r in reasons] == [(2, 400)]


def test_a_partly_failing_run_prints_reasons_and_exits_0(app: ServingApp, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    rows = [(0, 64), (10, 3000), (20, 64)]  # the 3000-token prompt cannot fit 2048
    trace.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": n, "output_length": 4}) + "\n"
            for t, n in rows
        )
    )
    args = ("--dataset-name", "mooncake-trace", "--dataset-path", str(trace), "--no-preflight")
    result = bench(app.endpoint, tmp_path, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 × HTTP 400: this model's maximum context length is 2048 tokens" in result.stdout
    summary = json.loads((tmp_path / "r.json").read_text())
    assert (summary["completed"], summary["failed"]) == (2, 1)
    assert summary["prompt_token_error_pct"]["max_abs"] == 0.0  # counted by the server
