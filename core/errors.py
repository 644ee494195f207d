"""Typed errors shared by every layer.

Each error carries an HTTP-style status and an OpenAI error ``type`` so the ingress can render
``{"error": {"message", "type", "param", "code"}}`` without guessing, and the CLI can print the
message without a traceback. ``param`` names the offending field or file where there is one.
"""

from __future__ import annotations


class PdserveError(Exception):
    """Base of all pdserve errors."""

    status_code: int = 500
    error_type: str = "internal_error"

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


class ModelNotFoundError(PdserveError):
    """A model path, built-in name or served model name does not exist (HTTP 404)."""

    status_code = 404
    error_type = "not_found_error"


class UnsupportedArchitectureError(ConfigError):
    """``config.json`` names an architecture pdserve cannot run."""


class WeightLoadError(PdserveError):
    """A checkpoint is missing a file or tensor, has an unexpected one, or a wrong shape."""

    status_code = 500
    error_type = "weight_load_error"


class KVCacheError(PdserveError):
    """The KV cache cannot hold what was asked of it."""

    status_code = 503
    error_type = "kv_cache_error"


class LayoutMismatchError(PdserveError):
    """Two KV layouts that must agree (prefill vs decode) differ."""

    status_code = 500
    error_type = "kv_layout_mismatch"


class TransferError(PdserveError):
    """A KV transfer failed; ``reason`` is a short machine-readable tag."""

    status_code = 503
    error_type = "kv_transfer_error"

    def __init__(self, message: str, *, reason: str, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.reason = reason


class OverloadedError(PdserveError):
    """The server is over capacity (HTTP 429); retry after ``retry_after_s``."""

    status_code = 429
    error_type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UnavailableError(PdserveError):
    """The server is draining or has no healthy capacity (HTTP 503)."""

    status_code = 503
    error_type = "service_unavailable"


class AuthenticationError(PdserveError):
    """A missing or wrong API key or transfer token (HTTP 401)."""

    status_code = 401
    error_type = "authentication_error"
