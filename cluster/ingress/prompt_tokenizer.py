"""What the ingress needs of a tokenizer: a Protocol ``engine.tokenizer.Tokenizer`` satisfies.

Every floor of the ingress that holds a tokenizer (the model table, the prompt builder, the
tokenizer routes) types it with this, so importing the ingress does not import the engine
package (and torch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class PromptTokenizer(Protocol):
    """What the ingress needs of ``engine.tokenizer.Tokenizer`` (which satisfies it).

    A Protocol, so importing the ingress does not import the engine package (and torch).
    """

    vocab_size: int

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` adds BOS where the model expects it."""
        ...

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """The text of ``token_ids`` (``/detokenize``)."""
        ...

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of ``token_id`` (``/tokenize`` with ``return_token_strs``)."""
        ...

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text of ``messages``; raises ``InvalidRequestError`` naming the field."""
        ...
