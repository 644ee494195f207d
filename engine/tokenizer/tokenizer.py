"""The tokenizer of a checkpoint directory: HF ``tokenizers`` plus the HF config files around it.

``tokenizer.json`` does the encoding and decoding; ``tokenizer_config.json`` supplies the special
tokens (BOS/EOS, whether BOS is added) and the chat template (which ``chat_template.jinja``
overrides, as in recent ``transformers``); ``generation_config.json`` adds the extra ids that end
a generation (Llama 3's ``<|eot_id|>``, ChatML's ``<|im_end|>``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from core.errors import ConfigError, InvalidRequestError, ModelNotFoundError
from engine.tokenizer.chat_template import ChatTemplate

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"
_SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


class Tokenizer:
    """Text <-> token ids for one model, with its special tokens and chat template."""

    def __init__(
        self,
        backend: HFTokenizer,
        config: Mapping[str, Any],
        *,
        chat_template: str | None = None,
        extra_eos_token_ids: Sequence[int] = (),
    ) -> None:
        self.backend = backend
        self.special_tokens = {k: _token_content(config.get(k)) for k in _SPECIAL_TOKEN_KEYS}
        self.bos_token_id = self._id_of(self.special_tokens["bos_token"])
        self.pad_token_id = self._id_of(self.special_tokens["pad_token"])
        eos_id = self._id_of(self.special_tokens["eos_token"])
        eos_ids = ([] if eos_id is None else [eos_id]) + list(extra_eos_token_ids)
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_ids))
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.special_token_ids: frozenset[int] = frozenset(
            token_id
            for token_id, token in backend.get_added_tokens_decoder().items()
            if token.special
        )
        # NOTE: ByteFallback decodes a broken run of byte tokens to one U+FFFD per byte, and a
        # run is judged as a whole; the detokenizer must then wait for the run to end.
        self.byte_fallback = _uses_byte_fallback(backend)
        backend_adds_bos = self.bos_token_id in backend.encode("", add_special_tokens=True).ids
        add_bos = config.get("add_bos_token")
        self._prepend_bos = add_bos is True and not backend_adds_bos
        self._strip_bos = add_bos is False and backend_adds_bos
        source = chat_template if chat_template is not None else _config_template(config)
        self._chat_template = None if source is None else ChatTemplate(source, self.special_tokens)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load the tokenizer files of a checkpoint directory.

        Raises :class:`ModelNotFoundError` when ``tokenizer.json`` is missing and
        :class:`ConfigError` when a file is unreadable or the chat template does not compile.
        """
        directory = Path(path)
        tokenizer_file = directory / TOKENIZER_FILE
        if not tokenizer_file.is_file():
            raise ModelNotFoundError(
                f"{str(tokenizer_file)!r} does not exist", param=TOKENIZER_FILE
            )
        try:
            backend = HFTokenizer.from_file(str(tokenizer_file))
        except Exception as e:  # the Rust side raises plain Exception subclasses
            raise ConfigError(
                f"cannot read {str(tokenizer_file)!r}: {e}", param=TOKENIZER_FILE
            ) from e
        config = _read_json(directory / TOKENIZER_CONFIG_FILE)
        generation = _read_json(directory / GENERATION_CONFIG_FILE)
        template_file = directory / CHAT_TEMPLATE_FILE
        template = template_file.read_text(encoding="utf-8") if template_file.is_file() else None
        return cls(
            backend,
            config,
            chat_template=template,
            extra_eos_token_ids=_id_list(generation.get("eos_token_id")),
        )

    @property
    def eos_token_id(self) -> int | None:
        """The primary end-of-sequence id (the tokenizer config's ``eos_token``)."""
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def has_chat_template(self) -> bool:
        """True when the checkpoint ships a chat template."""
        return self._chat_template is not None

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` adds BOS where the model expects it."""
        ids: list[int] = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self._prepend_bos and self.bos_token_id is not None:
            ids.insert(0, self.bos_token_id)
        elif add_special_tokens and self._strip_bos and ids and ids[0] == self.bos_token_id:
            del ids[0]
        return ids

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """The text of ``token_ids`` (invalid UTF-8 becomes U+FFFD)."""
        return str(self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of ``token_id`` (None when out of range)."""
        token: str | None = self.backend.id_to_token(token_id)
        return token

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """Render ``messages`` (OpenAI-style dicts) into the model's prompt text.

        Encode the result with ``add_special_tokens=False``: templates emit BOS themselves.
        """
        if self._chat_template is None:
            raise InvalidRequestError(
                "this model has no chat template; use a completion request", param="messages"
            )
        return self._chat_template.render(
            messages, add_generation_prompt=add_generation_prompt, template_kwargs=template_kwargs
        )

    def _id_of(self, token: str | None) -> int | None:
        if token is None:
            return None
        token_id: int | None = self.backend.token_to_id(token)
        return token_id


def _uses_byte_fallback(backend: HFTokenizer) -> bool:
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    stack = [decoder]
    while stack:
        node = stack.pop()
        if node.get("type") == "ByteFallback":
            return True
        stack.extend(node.get("decoders") or [])
    return False


def _token_content(value: Any) -> str | None:
    """A special token from a config value: a string or an ``AddedToken`` dict."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _config_template(config: Mapping[str, Any]) -> str | None:
    """The template in ``tokenizer_config.json``: a string or a list of named templates."""
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise ConfigError("chat_template must be a string", param="chat_template")
    return template


def _id_list(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int)]
    return []


def _read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; an empty dict when the (optional) file does not exist."""
    if not path.is_file():
        return {}
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {str(path)!r}: {e}", param=path.name) from e
    if not isinstance(body, dict):
        raise ConfigError(f"{str(path)!r} must hold a JSON object", param=path.name)
    return body
