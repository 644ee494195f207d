"""Request body -> prompt token ids, block hashes and sampling parameters.

Applies the chat template, tokenizes, checks the prompt against ``max_model_len`` and computes
the request's :class:`~core.messages.RoutingKeys` once: the prompt's chained block hashes with
``core.hashing`` (the function and seed the engines' prefix caches use, so routing predicts real
hits) and the session id. Every error names the offending field.
"""

from __future__ import annotations

from typing import Any

from cluster.ingress.dispatch.prepared_prompt import PreparedPrompt
from cluster.ingress.openai.request_sampling import sampling_params
from cluster.ingress.openai.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerationRequest,
)
from cluster.ingress.prompt_tokenizer import PromptTokenizer
from cluster.ingress.settings import IngressSettings
from core.errors import InvalidRequestError, PromptTooLongError
from core.hashing import hash_prompt_blocks
from core.messages import RoutingKeys

DEFAULT_COMPLETION_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` for a completion request."""


class PromptBuilder:
    """Turns validated request bodies into :class:`PreparedPrompt`s for one model."""

    def __init__(
        self,
        tokenizer: PromptTokenizer,
        settings: IngressSettings,
        lora_name: str | None = None,
    ) -> None:
        """``lora_name``: the LoRA adapter the prompts run under (None: the base model)."""
        self._tokenizer = tokenizer
        self._settings = settings
        self._lora_name = lora_name

    def completion(
        self,
        body: CompletionRequest,
        session_id: str | None = None,
        tenant_salt: str | None = None,
    ) -> PreparedPrompt:
        """A ``/v1/completions`` body: text or token ids; default ``max_tokens`` 16."""
        prompt_ids = self._fitted(self._completion_prompt_ids(body.prompt), body, body.max_tokens)
        max_tokens = self._max_tokens(
            prompt_ids, "prompt", body.max_tokens, "max_tokens", DEFAULT_COMPLETION_MAX_TOKENS
        )
        return self._prepared(prompt_ids, body, max_tokens, session_id, tenant_salt)

    def completion_batch(
        self,
        body: CompletionRequest,
        session_id: str | None = None,
        tenant_salt: str | None = None,
    ) -> list[PreparedPrompt]:
        """One prepared prompt per prompt of a ``/v1/completions`` body: a string, token ids, a
        list of strings or a list of token-id lists (at most ``server.max_batch_prompts``)."""
        items = body.prompt
        if not _is_batch(items):
            return [self.completion(body, session_id, tenant_salt)]
        limit = self._settings.server.max_batch_prompts
        if len(items) > limit:
            raise InvalidRequestError(
                f"at most {limit} prompts per request, got {len(items)}", param="prompt"
            )
        return [
            self.completion(body.model_copy(update={"prompt": item}), session_id, tenant_salt)
            for item in items
        ]

    def chat(
        self,
        body: ChatCompletionRequest,
        session_id: str | None = None,
        tenant_salt: str | None = None,
    ) -> PreparedPrompt:
        """A ``/v1/chat/completions`` body; default ``max_tokens``: the rest of the context."""
        if body.messages is None:
            raise InvalidRequestError("messages is required", param="messages")
        text = self._tokenizer.apply_chat_template(
            body.messages,
            add_generation_prompt=body.add_generation_prompt,
            template_kwargs=body.chat_template_kwargs,
        )
        prompt_ids = self._fitted(
            self._tokenizer.encode(text, add_special_tokens=False), body, body.requested_max_tokens
        )
        field = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        max_tokens = self._max_tokens(
            prompt_ids, "messages", body.requested_max_tokens, field, None
        )
        return self._prepared(prompt_ids, body, max_tokens, session_id, tenant_salt)

    def _completion_prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt is empty", param="prompt")
            ids = self._tokenizer.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
            ids = [int(t) for t in prompt]
            vocab = self._tokenizer.vocab_size
            if any(not 0 <= t < vocab for t in ids):
                raise InvalidRequestError(
                    f"prompt token ids must be in [0, {vocab})", param="prompt"
                )
        elif _is_batch(prompt):
            raise InvalidRequestError("a batch of prompts here: one prompt each", param="prompt")
        elif prompt is None:
            raise InvalidRequestError("prompt is required", param="prompt")
        else:
            raise InvalidRequestError(
                "prompt must be a string or a non-empty list of token ids", param="prompt"
            )
        if not ids:
            raise InvalidRequestError("prompt is empty", param="prompt")
        return ids

    def _fitted(
        self, prompt_ids: list[int], body: GenerationRequest, requested: int | None
    ) -> list[int]:
        """The prompt after the request's ``truncate_prompt_tokens`` (keep the last N) and the
        server's ``context_overflow: truncate_left`` (keep the last tokens that leave room for
        the requested ``max_tokens``, or for 16 when none is given)."""
        limit = self._settings.max_model_len
        keep = body.truncate_prompt_tokens
        if keep is not None:
            keep = limit - 1 if keep == -1 else keep
            prompt_ids = prompt_ids[-keep:]
        if self._settings.server.context_overflow == "truncate_left":
            room = limit - (requested or DEFAULT_COMPLETION_MAX_TOKENS)
            if 0 < room < len(prompt_ids):
                prompt_ids = prompt_ids[-room:]
        return prompt_ids

    def _max_tokens(
        self,
        prompt_ids: list[int],
        prompt_field: str,
        requested: int | None,
        requested_field: str,
        default: int | None,
    ) -> int:
        """The output budget; the prompt plus it must fit ``max_model_len``."""
        limit = self._settings.max_model_len
        room = limit - len(prompt_ids)
        if room <= 0:
            raise PromptTooLongError(
                f"this model's maximum context length is {limit} tokens; the prompt has "
                f"{len(prompt_ids)} tokens, leaving no room to generate",
                param=prompt_field,
            )
        if requested is None:
            return room if default is None else min(default, room)
        if requested > room:
            raise PromptTooLongError(
                f"this model's maximum context length is {limit} tokens; you requested "
                f"{len(prompt_ids) + requested} tokens ({len(prompt_ids)} in the prompt, "
                f"{requested} in the completion); reduce the prompt or {requested_field}",
                param=requested_field,
            )
        return requested

    def _prepared(
        self,
        prompt_ids: list[int],
        body: GenerationRequest,
        max_tokens: int,
        session_id: str | None,
        tenant_salt: str | None,
    ) -> PreparedPrompt:
        sampling = sampling_params(body, max_tokens, self._tokenizer.vocab_size)
        salt = combined_salt(tenant_salt, body.cache_salt)
        hashes = hash_prompt_blocks(
            prompt_ids,
            self._settings.block_size,
            seed=self._settings.hash_seed,
            salt=salt,
            lora_name=self._lora_name,
        )
        routing = RoutingKeys(
            tuple(hashes), len(prompt_ids), session_id, salt, lora_name=self._lora_name
        )
        if not getattr(body, "echo", False):
            return PreparedPrompt(prompt_ids, sampling, routing)
        decode = self._tokenizer.decode
        first = decode(prompt_ids[:1], skip_special_tokens=False)
        return PreparedPrompt(prompt_ids, sampling, routing, decode(prompt_ids), first)


def _is_batch(prompt: Any) -> bool:
    """A list of prompts (strings or token-id lists), not one prompt of token ids."""
    return (
        isinstance(prompt, list)
        and len(prompt) > 1
        and all(isinstance(item, str | list) for item in prompt)
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def combined_salt(tenant_salt: str | None, request_salt: str | None) -> str | None:
    """The cache salt a request's blocks are hashed with: its tenant's and its own, either one
    alone, or none (an unsalted request shares the common cache)."""
    if tenant_salt and request_salt:
        return f"{tenant_salt}/{request_salt}"
    return tenant_salt or request_salt or None
