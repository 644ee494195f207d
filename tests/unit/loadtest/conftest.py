"""Fixtures for the load-test tests: fake OpenAI servers (``fake_server.py``) started per test,
a virtual-time ``run_bench`` that serves them, and small tokenizers (``tokenizer.json`` and
tokenizer-only GGUF files) trained here.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.loadtest.fake_server import FakeBehaviour, FakeOpenAIServer
from tests.unit.loadtest.gguf_tokenizer_files import write_gguf_tokenizer
from tests.virtual_time import run_virtual


@pytest.fixture
def fake_servers() -> Iterator[dict[str, FakeOpenAIServer]]:
    """Every fake server of a test by base URL; all stopped after."""
    servers: dict[str, FakeOpenAIServer] = {}
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture
def fake_server(
    request: pytest.FixtureRequest, fake_servers: dict[str, FakeOpenAIServer]
) -> Callable[..., tuple[FakeOpenAIServer, str]]:
    """Factory: ``server, base_url = fake_server(FakeBehaviour(...))``. In a test that drives
    it with ``run_bench`` the server is served by that run, on its virtual-time loop; otherwise
    it serves in a thread of its own, in real time."""
    on_run_loop = "run_bench" in request.fixturenames

    def make(behaviour: FakeBehaviour | None = None) -> tuple[FakeOpenAIServer, str]:
        server = FakeOpenAIServer(behaviour or FakeBehaviour())
        fake_servers[server.url] = server
        return server, server.url if on_run_loop else server.start()

    return make


@pytest.fixture
def closed_port_url() -> str:
    """A loopback URL nothing listens on (connection refused)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"


@pytest.fixture
def bpe_tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A small byte-level BPE ``tokenizer.json`` (like Llama-3/Qwen2) trained on English words."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from loadtest import text

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, show_progress=False)
    corpus = [" ".join(text._WORDS)] * 20 + ["The quick brown fox jumps over the lazy dog."] * 5
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


@pytest.fixture
def byte_tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A byte-level tokenizer with no merges (one token per byte), like the built-in models'."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {char: i for i, char in enumerate(alphabet)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    directory = tmp_path_factory.mktemp("bytetok")
    tokenizer.save(str(directory / "tokenizer.json"))
    return str(directory)


@pytest.fixture(scope="session")
def gpt2_vocab(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[str], Path]:
    """A small byte-level BPE trained on English (every byte in its alphabet, one control token
    ``<|endoftext|>`` last): its tokens by id, its merges, and its ``tokenizer.json``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from loadtest import text

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    corpus = [" ".join(text._WORDS)] * 5 + ["The quick brown fox jumps over the lazy dog 2024."]
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    tokenizer.add_special_tokens(["<|endoftext|>"])
    path = tmp_path_factory.mktemp("gpt2vocab") / "tokenizer.json"
    tokenizer.save(str(path))
    saved = json.loads(path.read_text())["model"]
    tokens = [*sorted(saved["vocab"], key=saved["vocab"].get), "<|endoftext|>"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in saved["merges"]]
    return tokens, merges, path


@pytest.fixture
def gpt2_gguf(tmp_path: Path, gpt2_vocab: tuple[list[str], list[str], Path]) -> Path:
    """``gpt2_vocab`` as a tokenizer-only GGUF file (llama.cpp's ``gpt2`` model)."""
    tokens, merges, _ = gpt2_vocab
    types = [1] * (len(tokens) - 1) + [3]
    return write_gguf_tokenizer(tmp_path / "tiny-gpt2.gguf", "gpt2", tokens, types, merges=merges)


@pytest.fixture
def run_bench(fake_servers: dict[str, FakeOpenAIServer]) -> Callable[..., Any]:
    """``run_bench(base_url, workload=..., arrivals=..., target=..., slo=..., counter=...)``: one
    run on a virtual-time loop, which also serves the fake server at ``base_url`` (if any), so
    every latency it measures is the server's exact timing."""
    from loadtest.bench import BenchOutput, prepare_sessions, run_benchmark
    from loadtest.flags import validate
    from loadtest.tokens import TokenCounter, WordCounter

    def run(
        base_url: str,
        *,
        workload: dict[str, Any] | None = None,
        arrivals: dict[str, Any] | None = None,
        target: dict[str, Any] | None = None,
        slo: dict[str, Any] | None = None,
        counter: TokenCounter | None = None,
        base_dir: Any = None,
    ) -> BenchOutput:
        config = validate(
            {
                "target": {"base_url": base_url, "request_timeout_s": 10, **(target or {})},
                "workload": workload
                or {"kind": "random", "input_len": {"tokens": 16}, "output_len": {"tokens": 8}},
                "arrivals": {"num_requests": 8, **(arrivals or {})},
                "slo": slo or {},
            },
            "test",
        )
        counter = counter or WordCounter()
        sessions = prepare_sessions(config, counter, base_dir)
        server = fake_servers.get(base_url)

        async def serve_and_run() -> BenchOutput:
            if server is not None:
                await server.serve()
            try:
                return await asyncio.wait_for(run_benchmark(config, sessions, counter), 30)
            finally:
                if server is not None:
                    await server.close()

        output: BenchOutput = run_virtual(serve_and_run())
        return output

    return run
