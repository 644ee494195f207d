"""Typed errors shared by every layer.

Each error carries an HTTP-style status and an OpenAI error ``type`` so the ingress can render
``{"error": {"message", "type", "param", "code"}}`` without guessing, and the CLI can print the
message without a traceback. ``param`` names the offending field or file where there is one.
"""

from __future__ import annotations

from dataclasses import dataclass


class PdserveError(Exception):
    """Base of all pdserve errors."""

    status_code: int = 500
    error_type: str = "internal_error"
    retryable: bool = False
    """True when the same request may succeed if sent again later (overload, lost capacity)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def to_openai(self) -> dict[str, dict[str, str | int | None]]:
        """The OpenAI-shaped error body."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.status_code,
            }
        }


class InvalidRequestError(PdserveError):
    """A request field is out of range or malformed (HTTP 400)."""

    status_code = 400
    error_type = "invalid_request_error"


class SamplingParamsError(InvalidRequestError):
    """A sampling parameter is invalid; ``param`` names it."""


class PromptTooLongError(InvalidRequestError):
    """The prompt (plus requested tokens) does not fit ``max_model_len``."""


class RequestTimeoutError(PdserveError):
    """A request did not finish within its deadline (HTTP 408)."""

    status_code = 408
    error_type = "timeout_error"


class RequestTooLargeError(InvalidRequestError):
    """A request body is over the size limit (HTTP 413)."""

    status_code = 413


class ConfigError(PdserveError):
    """A configuration file or value is invalid; ``param`` names the field."""

    status_code = 400
    error_type = "config_error"


class UpgradeRefusedError(ConfigError):
    """A running cluster cannot be upgraded in place to a config (another model architecture,
    another set of served models, another cluster section); ``param`` names what differs."""

    error_type = "upgrade_refused"


class RolloutFailedError(PdserveError):
    """A stepped rollout stopped: a new replica failed or never became healthy; the old
    version keeps serving at the step reached (``param`` names the pool)."""

    status_code = 503
    error_type = "rollout_failed"


class ModelNotFoundError(PdserveError):
    """A model path, built-in name or served model name does not exist (HTTP 404)."""

    status_code = 404
    error_type = "not_found_error"


class UnsupportedArchitectureError(ConfigError):
    """``config.json`` names an architecture pdserve cannot run."""


class LoRAAdapterError(InvalidRequestError):
    """A LoRA adapter cannot be served; ``param`` names the adapter. Nothing of it was loaded.
    The subclasses say why."""


class LoRARankError(LoRAAdapterError):
    """The adapter's rank is above the engine's ``max_lora_rank``."""


class LoRATargetError(LoRAAdapterError):
    """The adapter targets modules the served model lacks (or pdserve cannot adapt)."""


class LoRABaseModelError(LoRAAdapterError):
    """The adapter was trained on another base model than the one served."""


class LoRAFileError(LoRAAdapterError):
    """The adapter's directory or files are missing, unreadable, corrupt or misshapen."""


class LoRAConfigError(LoRAAdapterError):
    """The adapter's ``adapter_config.json`` asks for something pdserve does not support."""


class WeightLoadError(PdserveError):
    """A checkpoint is missing a file or tensor, has an unexpected one, or a wrong shape."""

    status_code = 500
    error_type = "weight_load_error"


class KVCacheError(PdserveError):
    """The KV cache cannot hold what was asked of it."""

    status_code = 503
    error_type = "kv_cache_error"
    retryable = True


class LayoutMismatchError(PdserveError):
    """Two KV layouts that must agree (prefill vs decode) differ."""

    status_code = 500
    error_type = "kv_layout_mismatch"


class TransferError(PdserveError):
    """A KV transfer failed; ``reason`` is a short machine-readable tag."""

    status_code = 503
    error_type = "kv_transfer_error"
    retryable = True

    def __init__(self, message: str, *, reason: str, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.reason = reason


class OverloadedError(PdserveError):
    """The server is over capacity (HTTP 429); retry after ``retry_after_s``."""

    status_code = 429
    error_type = "rate_limit_error"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UnavailableError(PdserveError):
    """The server is draining or has no healthy capacity (HTTP 503)."""

    status_code = 503
    error_type = "service_unavailable"
    retryable = True


class AuthenticationError(PdserveError):
    """A missing or wrong API key or transfer token (HTTP 401)."""

    status_code = 401
    error_type = "authentication_error"


class MessageError(PdserveError):
    """A control message does not decode into its type (a peer of another version, a bug)."""

    status_code = 500
    error_type = "internal_error"


_KINDS: dict[str, type[PdserveError]] = {
    cls.__name__: cls
    for cls in (
        PdserveError,
        InvalidRequestError,
        SamplingParamsError,
        PromptTooLongError,
        RequestTimeoutError,
        RequestTooLargeError,
        ConfigError,
        ModelNotFoundError,
        UnsupportedArchitectureError,
        WeightLoadError,
        LoRAAdapterError,
        LoRARankError,
        LoRATargetError,
        LoRABaseModelError,
        LoRAFileError,
        LoRAConfigError,
        KVCacheError,
        LayoutMismatchError,
        TransferError,
        OverloadedError,
        UnavailableError,
        AuthenticationError,
        MessageError,
    )
}
"""The one table that turns an :class:`ErrorReport` back into its exception class."""


@dataclass(frozen=True)
class ErrorReport:
    """A typed error as it crosses a process boundary — the same shape for both roles.

    ``kind`` names the ``core.errors`` class; ``status_code`` and ``retryable`` travel with it
    so a reader needs no table to answer the client. ``reason`` is a transfer failure's tag,
    ``retry_after_s`` an overload's back-off.
    """

    kind: str
    message: str
    status_code: int
    retryable: bool
    param: str | None = None
    reason: str | None = None
    retry_after_s: float | None = None

    @classmethod
    def of(cls, error: PdserveError) -> ErrorReport:
        """The report of a raised error."""
        kind = type(error).__name__ if type(error).__name__ in _KINDS else "PdserveError"
        return cls(
            kind=kind,
            message=error.message,
            status_code=error.status_code,
            retryable=error.retryable,
            param=error.param,
            reason=getattr(error, "reason", None),
            retry_after_s=getattr(error, "retry_after_s", None),
        )

    def to_error(self) -> PdserveError:
        """The exception this report describes (same class, message, param and status)."""
        cls = _KINDS.get(self.kind, PdserveError)
        if issubclass(cls, TransferError):
            return cls(self.message, reason=self.reason or "internal", param=self.param)
        if issubclass(cls, OverloadedError):
            return cls(self.message, retry_after_s=self.retry_after_s or 1.0)
        error = cls(self.message, param=self.param)
        if cls is PdserveError:
            # NOTE: an unknown kind (a newer peer) keeps the status the peer chose.
            error.status_code = self.status_code
        return error
