"""A ``tokenizers.Tokenizer`` rebuilt from a GGUF file's metadata, for exact prompt lengths
against servers that load GGUF files (llama.cpp, llama-cpp-python) and offer no ``/tokenize``.

A GGUF file carries no ``tokenizer.json``: the vocabulary, merges and special tokens live in its
metadata under llama.cpp's keys (``tokenizer.ggml.*``). Two tokenizer models are rebuilt, as
transformers' GGUF conversion rebuilds them:

- ``gpt2``: byte-level BPE from ``tokens`` and ``merges``. Text is split by GPT-2's pattern,
  or by Llama-3's / Qwen2's when ``tokenizer.ggml.pre`` names that family.
- ``llama``: SentencePiece BPE with byte fallback; without ``merges`` in the file, every split
  of a token into two tokens is a merge, ranked by the token's ``score`` (best first).

Control tokens stay whole (special), as do user-defined ones; BOS / EOS are added around a
prompt where ``add_bos_token`` / ``add_eos_token`` say (``llama`` adds BOS unless told not to).
Any other tokenizer model is refused in one line. The file is read with the ``gguf`` package,
imported only when a GGUF tokenizer is asked for (it is not part of the client install).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers, processors

from core.errors import ConfigError

_KEY = "tokenizer.ggml."
_MAGIC = b"GGUF"
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
_SPLITS = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "falcon3": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}
"""``tokenizer.ggml.pre`` -> the split pattern its merges were learned on (others: GPT-2's)."""


def read_gguf_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer ``path`` (a GGUF file) describes; ``ConfigError`` (param ``tokenizer``)
    for a file that is not GGUF, has no tokenizer, or names a model not rebuilt here."""
    fields = _tokenizer_fields(path)
    kind = fields.get("model")
    build = _BUILDERS.get(kind) if isinstance(kind, str) else None
    if build is None:
        raise ConfigError(
            f"{path}: GGUF tokenizer model {kind!r} is not supported for counting "
            f"(supported: {', '.join(_BUILDERS)}); pass its tokenizer.json with --tokenizer",
            param="tokenizer",
        )
    if not fields.get("tokens"):
        raise ConfigError(f"{path}: the GGUF file lists no tokenizer tokens", param="tokenizer")
    tokenizer = build(fields)
    _add_listed_tokens(tokenizer, fields)
    _add_bos_eos(tokenizer, fields, bos_default=kind == "llama")
    return tokenizer


def _tokenizer_fields(path: Path) -> dict[str, Any]:
    """The file's ``tokenizer.ggml.*`` metadata, keyed without that prefix."""
    try:
        import gguf
    except ImportError as e:
        raise ConfigError(
            "a GGUF --tokenizer needs the gguf package: pip install gguf", param="tokenizer"
        ) from e
    try:
        with path.open("rb") as f:
            magic = f.read(len(_MAGIC))
        if magic != _MAGIC:
            raise ConfigError(
                f"{path} is not a GGUF file (it starts with {magic!r}, not {_MAGIC!r})",
                param="tokenizer",
            )
        reader = gguf.GGUFReader(path)
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e}", param="tokenizer") from e
    except (ValueError, IndexError, KeyError) as e:  # what the reader raises past the magic
        raise ConfigError(f"{path}: truncated or corrupt GGUF file ({e})", param="tokenizer") from e
    return {
        name.removeprefix(_KEY): field.contents()
        for name, field in reader.fields.items()
        if name.startswith(_KEY)
    }


def _byte_level_bpe(fields: dict[str, Any]) -> Tokenizer:
    """GPT-2 style: the vocabulary is spelled in the byte alphabet, merges are listed."""
    tokens: list[str] = fields["tokens"]
    merges = [_merge_pair(merge) for merge in fields.get("merges") or ()]
    tokenizer = Tokenizer(models.BPE(vocab=_vocab(tokens), merges=merges))
    split = _SPLITS.get(str(fields.get("pre", "")))
    if split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    return tokenizer


def _sentencepiece_bpe(fields: dict[str, Any]) -> Tokenizer:
    """Llama / Mistral style: ``▁`` for spaces, byte tokens for what the vocabulary lacks."""
    tokens: list[str] = fields["tokens"]
    listed = fields.get("merges")
    if listed:
        merges = [_merge_pair(merge) for merge in listed]
    else:
        merges = _merges_by_score(tokens, fields.get("scores") or [0.0] * len(tokens))
    unk_id = int(fields.get("unknown_token_id", 0))
    model = models.BPE(
        vocab=_vocab(tokens),
        merges=merges,
        unk_token=tokens[unk_id] if 0 <= unk_id < len(tokens) else None,
        fuse_unk=True,
        byte_fallback=True,
    )
    tokenizer = Tokenizer(model)
    prepend = "first" if fields.get("add_space_prefix", True) else "never"
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme=prepend, split=False
    )
    return tokenizer


_BUILDERS: dict[str, Callable[[dict[str, Any]], Tokenizer]] = {
    "gpt2": _byte_level_bpe,
    "llama": _sentencepiece_bpe,
}


def _vocab(tokens: Sequence[str]) -> dict[str, int]:
    """Token -> id; a token listed twice keeps its first id."""
    vocab: dict[str, int] = {}
    for token_id, token in enumerate(tokens):
        vocab.setdefault(token, token_id)
    return vocab


def _merge_pair(merge: str) -> tuple[str, str]:
    left, _, right = merge.partition(" ")
    return left, right


def _merges_by_score(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """SentencePiece stores no merges: each split of a token into two tokens is one, the best
    scored token's first; ties keep the vocabulary's order, then the pieces' ids."""
    ids = _vocab(tokens)
    ranked: list[tuple[float, int, int, int, str, str]] = []
    for token_id, (token, score) in enumerate(zip(tokens, scores, strict=False)):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                ranked.append((-score, token_id, ids[left], ids[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _add_listed_tokens(tokenizer: Tokenizer, fields: dict[str, Any]) -> None:
    """Control tokens (``<|im_start|>``) as special, user-defined ones as added: both match
    whole in text instead of being cut into pieces."""
    kinds = fields.get("token_type") or ()
    pairs = list(zip(fields["tokens"], kinds, strict=False))
    control = [AddedToken(t, special=True, normalized=False) for t, k in pairs if k == _CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, k in pairs if k == _USER_DEFINED]
    tokenizer.add_special_tokens(control)
    tokenizer.add_tokens(user)


def _add_bos_eos(tokenizer: Tokenizer, fields: dict[str, Any], *, bos_default: bool) -> None:
    """BOS / EOS around a prompt encoded with special tokens, where the file asks for them."""
    tokens: list[str] = fields["tokens"]
    pieces, special = ["$A"], []
    bos_id, eos_id = fields.get("bos_token_id"), fields.get("eos_token_id")
    if fields.get("add_bos_token", bos_default) and bos_id is not None:
        pieces.insert(0, tokens[int(bos_id)])
        special.append((tokens[int(bos_id)], int(bos_id)))
    if fields.get("add_eos_token", False) and eos_id is not None:
        pieces.append(tokens[int(eos_id)])
        special.append((tokens[int(eos_id)], int(eos_id)))
    if special:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=pieces, special_tokens=special
        )
