"""The OpenAI request bodies pdserve accepts, as pydantic models.

Fields the load testers send (``vllm bench serve``, ``pdserve bench``) and the official client
sends are declared; anything else is dropped (``extra="ignore"``), so client-supplied transfer
parameters such as ``kv_transfer_params`` never reach a worker. Fields whose shape is a union
(``prompt``, ``stop``, ``messages``) are validated by :mod:`cluster.ingress.prompts`, which names
the offending field more precisely than a pydantic union error would.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a final chunk with the token counts."""

    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class GenerationRequest(BaseModel):
    """The sampling fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_tokens: int | None = Field(None, ge=0)
    seed: int | None = None
    stop: Any = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    """vLLM's field: keep only the last N prompt tokens (-1: the last max_model_len - 1)."""
    cache_salt: str | None = Field(None, min_length=1, max_length=256)
    """vLLM's field: requests share cached prefix blocks only with requests of the same salt."""
    kv_keep_alive_s: float | None = Field(None, ge=0.0)
    """pdserve extension: keep this session's KV past the idle TTLs for this long."""
    response_format: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    """Output constraints (``cluster.ingress.structured``): OpenAI's and vLLM's fields."""

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _keep_some_tokens(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("truncate_prompt_tokens must be >= 1 (or -1 for max_model_len - 1)")
        return value

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError(f"only n=1 is supported, got {value}")
        return value

    @property
    def include_usage(self) -> bool:
        """True when a streamed response ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(GenerationRequest):
    """``POST /v1/completions``."""

    prompt: Any = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("echo is not supported")
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix is not supported")
        return value

    @field_validator("best_of")
    @classmethod
    def _one_best(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError(f"only best_of=1 is supported, got {value}")
        return value

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError("logprobs are not supported by this server")
        return value


class ChatCompletionRequest(GenerationRequest):
    """``POST /v1/chat/completions``."""

    messages: Any = None
    max_completion_tokens: int | None = Field(None, ge=1)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("logprobs are not supported by this server")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _no_top_logprobs(cls, value: int | None) -> int | None:
        if value:
            raise ValueError("top_logprobs are not supported by this server")
        return value

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` (the current name) or else the legacy ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens
