"""Counting prompt tokens: the ``TokenCounter`` contract, a local tokenizer, and the fallback.

A counter counts *text* tokens (no special tokens); ``overhead_tokens`` is what the server adds
around one prompt (BOS, a chat template), so a request's prompt is ``count(text) +
overhead_tokens`` tokens on the server. ``tokens_per_count`` converts the counter's unit into
tokens (1 except for the calibrated estimate, which counts words). Four modes, best first:

- ``tokenizer``: ``--tokenizer`` (or a ``--model`` that is a local directory or GGUF file)
  names a ``tokenizer.json`` file, a directory holding one, or a GGUF file (its tokenizer is
  rebuilt from the metadata, ``gguf_tokenizer.py``: for llama.cpp-style servers, which have no
  ``/tokenize``); ``builtin:NAME`` looks in the built-in model cache
  (``core.builtin_models.builtin_dir(NAME)``, written the first time pdserve loads it).
- ``server``: the server counts (``POST /tokenize``, see ``server_tokens.py``).
- ``calibrated``: words scaled by tokens-per-word fitted to the server's reported usage
  (``calibration.py``).
- ``approximate``: one token per whitespace-separated word. Prompts are built from short
  common English words, which Llama-3, Qwen2 and Mistral vocabularies hold as single tokens,
  so lengths land within a few percent there (a byte-level tokenizer is off ~6x).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from core.builtin_models import builtin_dir, builtin_name
from core.errors import ConfigError, ModelNotFoundError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

_GGUF_MAGIC = b"GGUF"


class TokenCounter(Protocol):
    """Counts the tokens a text encodes to (no special tokens added)."""

    name: str
    """What counts (a tokenizer path, a server URL, a description)."""
    exact: bool
    """True when ``count`` is the target tokenizer's own count."""
    mode: str
    """``tokenizer``, ``server``, ``calibrated`` or ``approximate``."""
    overhead_tokens: int
    """Tokens the server adds around one prompt (BOS, chat template)."""
    tokens_per_count: float
    """Tokens per unit of ``count`` (1.0 unless the counter estimates in words)."""

    def count(self, text: str) -> int:
        """Number of tokens in ``text``."""
        ...


class WordCounter:
    """The documented approximation: one token per whitespace-separated word."""

    name = "approx-words"
    exact = False
    mode = "approximate"
    overhead_tokens = 0
    tokens_per_count = 1.0

    def count(self, text: str) -> int:
        """Whitespace-separated words in ``text``."""
        return len(text.split())


class HFTokenCounter:
    """Exact counts from a HF ``tokenizer.json`` (or a GGUF file's tokenizer) via the
    ``tokenizers`` library."""

    exact = True
    mode = "tokenizer"
    tokens_per_count = 1.0

    def __init__(self, path: Path) -> None:
        self.tokenizer: Tokenizer = _load_tokenizer(path)
        """What counts (``tokenizers.Tokenizer``)."""
        self.name = str(path)
        # BOS and the like, as the tokenizer's own post-processor adds them (a server that adds
        # BOS in its own code, not in tokenizer.json, adds one more: the report shows it).
        self.overhead_tokens = len(self.tokenizer.encode("x").ids) - self.count("x")

    def count(self, text: str) -> int:
        """Tokens of ``text`` without special tokens."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)


def _load_tokenizer(path: Path) -> Tokenizer:
    if is_gguf_file(path):
        from loadtest.gguf_tokenizer import read_gguf_tokenizer

        return read_gguf_tokenizer(path)
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises bare Exception subclasses
        raise ConfigError(f"cannot load tokenizer {path}: {e}", param="tokenizer") from e


def is_gguf_file(path: Path) -> bool:
    """True for a file named ``*.gguf`` or starting with GGUF's magic."""
    if not path.is_file():
        return False
    if path.suffix.lower() == ".gguf":
        return True
    with path.open("rb") as f:
        return f.read(4) == _GGUF_MAGIC


def resolve_tokenizer_file(spec: str) -> Path:
    """The tokenizer file (``tokenizer.json`` or GGUF) for a file, a directory or
    ``builtin:NAME``; error if missing."""
    builtin = builtin_name(spec) is not None
    path = builtin_dir(spec) if builtin else Path(spec).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        hint = " (run the model once so pdserve writes it)" if builtin else ""
        raise ModelNotFoundError(
            f"no tokenizer.json or GGUF file at {path}{hint}", param="tokenizer"
        )
    return path


def load_token_counter(tokenizer: str | None, model: str | None = None) -> TokenCounter:
    """The exact counter for ``tokenizer``, else for ``model`` when it is a local GGUF file, a
    local directory or a cached ``builtin:NAME`` holding a ``tokenizer.json``, else the
    approximation."""
    if tokenizer:
        return HFTokenCounter(resolve_tokenizer_file(tokenizer))
    if model:
        is_builtin = builtin_name(model) is not None
        candidate = builtin_dir(model) if is_builtin else Path(model).expanduser()
        if is_gguf_file(candidate):
            return HFTokenCounter(candidate)
        if (candidate / "tokenizer.json").is_file():
            return HFTokenCounter(candidate / "tokenizer.json")
    return WordCounter()
