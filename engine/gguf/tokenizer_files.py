"""A GGUF file's tokenizer as HF tokenizer files, through transformers' GGUF conversion.

``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` rebuilds the tokenizer a GGUF describes
(vocabulary, merges, special tokens, ``add_bos_token``, chat template) and ``save_pretrained``
writes it as ``tokenizer.json`` + ``tokenizer_config.json`` (+ ``chat_template.jinja``), which
:class:`engine.tokenizer.Tokenizer` reads like any checkpoint's. ``generation_config.json`` adds
the ids that end a generation: the file's EOS, its end-of-turn / end-of-message tokens, and the
special token the chat template writes right after an assistant message (ChatML's
``<|im_end|>``, Llama 3's ``<|eot_id|>``) — what a chat stops on.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from core.errors import WeightLoadError
from engine.gguf.file import GGUFFile

logger = logging.getLogger(__name__)

GENERATION_CONFIG_FILE = "generation_config.json"
_STOP_ID_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                 "tokenizer.ggml.eom_token_id")  # fmt: skip
_TURN_PROBE = "pdserve-end-of-turn-probe"


def write_tokenizer_files(file: GGUFFile, directory: Path) -> None:
    """Write ``file``'s tokenizer and generation config into ``directory``."""
    if file.field("tokenizer.ggml.model") is None:
        raise WeightLoadError(
            f"GGUF file {str(file.path)!r} carries no tokenizer (tokenizer.ggml.model)",
            param="tokenizer.ggml.model",
        )
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(file.path.parent, gguf_file=file.path.name)
    except Exception as e:  # transformers and the Rust tokenizers raise plain Exceptions
        raise WeightLoadError(
            f"cannot build the tokenizer of GGUF file {str(file.path)!r}: {e}",
            param="tokenizer.ggml.model",
        ) from e
    tokenizer.save_pretrained(directory)
    stop_ids = [file.field(key) for key in _STOP_ID_KEYS]
    stop_ids.append(_end_of_turn_id(tokenizer))
    generation = {
        "bos_token_id": file.field("tokenizer.ggml.bos_token_id"),
        "eos_token_id": list(dict.fromkeys(int(i) for i in stop_ids if i is not None)),
    }
    body = json.dumps(generation, indent=2, sort_keys=True) + "\n"
    (directory / GENERATION_CONFIG_FILE).write_text(body, encoding="utf-8")


def _end_of_turn_id(tokenizer: Any) -> int | None:
    """The special token the chat template writes right after an assistant message."""
    if not tokenizer.chat_template:
        return None
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _TURN_PROBE}]
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception as e:  # templates raise what they like on an unusual conversation
        logger.info("chat template did not render a probe conversation (%s)", e)
        return None
    if _TURN_PROBE not in str(text):
        return None
    after = str(text).split(_TURN_PROBE, 1)[1].lstrip(" ")
    special = {token.content: token_id for token_id, token in tokenizer.added_tokens_decoder.items()
               if token.special}  # fmt: skip
    found = [token for token in special if after.startswith(token)]
    return special[max(found, key=len)] if found else None
