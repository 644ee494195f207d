"""Counting prompt tokens: exactly with the target model's ``tokenizer.json``, or approximately.

``--tokenizer`` (or a ``--model`` that is a local directory) takes a ``tokenizer.json`` file or
a directory holding one; ``builtin:NAME`` looks in the built-in model cache
(``core.env.cache_dir()/models/NAME``, written the first time pdserve loads that model; pass
that directory explicitly if your cache lives elsewhere).

Without a tokenizer the count is an **approximation**: one token per whitespace-separated word.
Prompts are then built from short common English words, which Llama-3, Qwen2 and Mistral
vocabularies hold as single tokens (with their leading space), so prompt lengths land within a
few percent of the real count; the server's ``usage.prompt_tokens`` (when it reports usage)
replaces the estimate in the results anyway.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from core.env import cache_dir
from core.errors import ConfigError, ModelNotFoundError

BUILTIN_PREFIX = "builtin:"


class TokenCounter(Protocol):
    """Counts the tokens a text encodes to (no special tokens added)."""

    name: str
    exact: bool

    def count(self, text: str) -> int:
        """Number of tokens in ``text``."""
        ...


class WordCounter:
    """The documented approximation: one token per whitespace-separated word."""

    name = "approx-words"
    exact = False

    def count(self, text: str) -> int:
        """Whitespace-separated words in ``text``."""
        return len(text.split())


class HFTokenCounter:
    """Exact counts from a HF ``tokenizer.json`` via the ``tokenizers`` library."""

    exact = True

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # the library raises bare Exception subclasses
            raise ConfigError(f"cannot load tokenizer {path}: {e}", param="tokenizer") from e
        self.name = str(path)

    def count(self, text: str) -> int:
        """Tokens of ``text`` without special tokens."""
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


def resolve_tokenizer_file(spec: str) -> Path:
    """``tokenizer.json`` for a file, a directory or ``builtin:NAME``; error if missing."""
    if spec.startswith(BUILTIN_PREFIX):
        path = cache_dir() / "models" / spec.removeprefix(BUILTIN_PREFIX)
    else:
        path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        hint = " (run the model once so pdserve writes it)" if spec.startswith("builtin:") else ""
        raise ModelNotFoundError(f"no tokenizer.json at {path}{hint}", param="tokenizer")
    return path


def load_token_counter(tokenizer: str | None, model: str | None = None) -> TokenCounter:
    """The exact counter for ``tokenizer``, else for ``model`` when it is a local directory or a
    cached ``builtin:NAME`` holding a ``tokenizer.json``, else the approximation."""
    if tokenizer:
        return HFTokenCounter(resolve_tokenizer_file(tokenizer))
    if model:
        if model.startswith(BUILTIN_PREFIX):
            candidate = cache_dir() / "models" / model.removeprefix(BUILTIN_PREFIX)
        else:
            candidate = Path(model).expanduser()
        if (candidate / "tokenizer.json").is_file():
            return HFTokenCounter(candidate / "tokenizer.json")
    return WordCounter()
