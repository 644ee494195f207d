"""The OpenAI request bodies pdserve accepts, as pydantic models.

Fields the load testers send (``vllm bench serve``, ``pdserve bench``) and the official client
sends are declared; anything else is dropped (``extra="ignore"``), so client-supplied transfer
parameters such as ``kv_transfer_params`` never reach a worker. Fields whose shape is a union
(``prompt``, ``stop``, ``messages``) are validated by :mod:`cluster.ingress.openai.prompts`,
which names the offending field more precisely than a pydantic union error would.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic.json_schema import JsonDict

from core.sampling import MAX_SEED, MIN_SEED


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a final chunk with the token counts;
    ``continuous_usage_stats`` (vLLM) puts the counts so far on every chunk."""

    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False
    continuous_usage_stats: bool = False


class GenerationRequest(BaseModel):
    """The sampling fields shared by completions and chat completions."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_tokens: int | None = Field(None, ge=0)
    seed: int | None = Field(None, ge=MIN_SEED, le=MAX_SEED)
    """Any signed 64-bit integer (vLLM's range; -1 is a seed like any other)."""
    stop: Any = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    n: int | None = Field(None, ge=1)
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    """vLLM's field: the top-N log-probabilities of every prompt token."""
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
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
    """Output constraints (``cluster.ingress.openai.structured``): OpenAI's and vLLM's fields."""

    @field_validator("truncate_prompt_tokens")
    @classmethod
    def _keep_some_tokens(cls, value: int | None) -> int | None:
        if value == 0:
            raise ValueError("truncate_prompt_tokens must be >= 1 (or -1 for max_model_len - 1)")
        return value

    @property
    def include_usage(self) -> bool:
        """True when a streamed response ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """True when every streamed chunk carries the usage so far."""
        return self.stream_options is not None and self.stream_options.continuous_usage_stats

    @property
    def num_choices(self) -> int:
        """``n``: choices per prompt."""
        return self.n or 1

    @property
    def num_samples(self) -> int:
        """Sequences generated per prompt (``best_of`` where given, else ``n``)."""
        return self.num_choices

    def requested_logprobs(self) -> int | None:
        """Top-N logprobs per generated token the response shows (None: none)."""
        return None

    def sampling_logprobs(self) -> int | None:
        """What the engine computes: the shown top-N, or 0 when ``best_of`` ranks choices by
        their cumulative logprob without showing them."""
        shown = self.requested_logprobs()
        return 0 if shown is None and self.num_samples > self.num_choices else shown

    def sampling_prompt_logprobs(self) -> int | None:
        """Top-N logprobs of every prompt token the engine computes (None: none)."""
        return self.prompt_logprobs


_TOKEN_IDS: JsonDict = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_PROMPT_SHAPES: JsonDict = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "minItems": 1},
        _TOKEN_IDS,
        {"type": "array", "items": _TOKEN_IDS, "minItems": 1},
    ]
}
_MESSAGE: JsonDict = {
    "type": "object",
    "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array"}, {"type": "null"}]},
    },
    "required": ["role"],
}


def _requires(*fields: str) -> Any:
    """A ``json_schema_extra`` that lists ``fields`` as required in the published schema
    (the model itself defaults them to None, so a missing one gets pdserve's own 400)."""

    def extra(schema: dict[str, Any]) -> None:
        schema["required"] = [*schema.get("required", []), *fields]

    return extra


class CompletionRequest(GenerationRequest):
    """``POST /v1/completions``."""

    model_config = ConfigDict(extra="ignore", json_schema_extra=_requires("prompt"))

    prompt: Any = Field(None, json_schema_extra=_PROMPT_SHAPES)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("suffix is not supported: pdserve serves no fill-in-the-middle model")
        return value

    @property
    def num_samples(self) -> int:
        return max(self.best_of or 1, self.num_choices)

    def requested_logprobs(self) -> int | None:
        return self.logprobs

    def sampling_prompt_logprobs(self) -> int | None:
        """With ``echo`` the prompt's logprobs are shown too."""
        if self.echo and self.logprobs is not None:
            return max(self.logprobs, self.prompt_logprobs or 0)
        return self.prompt_logprobs


class ChatCompletionRequest(GenerationRequest):
    """``POST /v1/chat/completions``."""

    model_config = ConfigDict(extra="ignore", json_schema_extra=_requires("messages"))

    messages: Any = Field(
        None, json_schema_extra={"type": "array", "items": _MESSAGE, "minItems": 1}
    )
    max_completion_tokens: int | None = Field(None, ge=1)
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return value

    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens`` (the current name) or else the legacy ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens
