"""Who may talk to an exporter: the shared auth token and optional mutual TLS.

Every call carries ``authorization: Bearer <token>`` in its metadata; the server compares it in
constant time (``hmac.compare_digest``) before any handler runs and answers UNAUTHENTICATED
otherwise, so a wrong token changes nothing. The health service is exempt (probes carry no
token). The token comes from a file, an environment variable, or (tests only) the config itself,
never from YAML in production. mTLS needs a certificate, key and CA bundle on every worker: the
server then requires client certificates signed by that CA, and clients verify the server's.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc

from core import env
from core.config import TransferConfig
from core.errors import ConfigError

logger = logging.getLogger(__name__)

AUTH_METADATA_KEY = "authorization"
_EXEMPT_PREFIX = "/grpc.health.v1.Health/"


def resolve_auth_token(
    config: TransferConfig, environ: Mapping[str, str] | None = None
) -> bytes | None:
    """The shared token from the test value, ``auth_token_file`` or ``auth_token_env``; or None.

    Raises ``ConfigError`` when the file is unreadable or ``require_auth`` is set and no token
    is found.
    """
    token: str | None = config.insecure_test_token
    if token is None and config.auth_token_file:
        try:
            token = Path(config.auth_token_file).read_text().strip()
        except OSError as e:
            raise ConfigError(
                f"cannot read kv transfer token file: {e}", param="transfer.auth_token_file"
            ) from e
    if token is None and config.auth_token_env:
        token = env.secret_from_env(config.auth_token_env, environ)
    if token:
        return token.encode()
    if config.require_auth:
        raise ConfigError(
            "transfer.require_auth is set but no kv transfer token was found",
            param="transfer.auth_token_env",
        )
    return None


def call_metadata(token: bytes | None) -> tuple[tuple[str, str], ...]:
    """Metadata to attach to every call of a client holding ``token``."""
    if token is None:
        return ()
    return ((AUTH_METADATA_KEY, "Bearer " + token.decode()),)


class TokenAuthInterceptor(grpc.ServerInterceptor):
    """Rejects every non-health call whose bearer token differs from the shared one."""

    def __init__(self, token: bytes, on_reject: Callable[[], None] | None = None) -> None:
        """``on_reject`` is called once per refused call (the metrics counter)."""
        self._expected = b"Bearer " + token
        self._on_reject = on_reject

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        """Pass authorized (or exempt) calls on; answer the rest UNAUTHENTICATED."""
        method: str = handler_call_details.method
        handler = continuation(handler_call_details)
        if handler is None or method.startswith(_EXEMPT_PREFIX):
            return handler
        metadata = handler_call_details.invocation_metadata or ()
        presented = b""
        for key, value in metadata:
            if key == AUTH_METADATA_KEY:
                presented = value.encode() if isinstance(value, str) else value
        if hmac.compare_digest(presented, self._expected):
            return handler
        logger.warning("kv transfer call %s rejected: missing or wrong token", method)
        if self._on_reject is not None:
            self._on_reject()
        return _deny(handler)


def _deny(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    def abort(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong kv transfer token")

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort)
    return grpc.unary_unary_rpc_method_handler(abort)


def _read_pem(path: str, field: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read {field}: {e}", param=f"transfer.{field}") from e


def server_credentials(config: TransferConfig) -> grpc.ServerCredentials | None:
    """mTLS server credentials (client certificates required), or None without TLS."""
    if not config.tls_cert_file or not config.tls_key_file or not config.tls_ca_file:
        return None
    return grpc.ssl_server_credentials(
        [
            (
                _read_pem(config.tls_key_file, "tls_key_file"),
                _read_pem(config.tls_cert_file, "tls_cert_file"),
            )
        ],
        root_certificates=_read_pem(config.tls_ca_file, "tls_ca_file"),
        require_client_auth=True,
    )


def channel_credentials(config: TransferConfig) -> grpc.ChannelCredentials | None:
    """mTLS client credentials, or None without TLS."""
    if not config.tls_cert_file or not config.tls_key_file or not config.tls_ca_file:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=_read_pem(config.tls_ca_file, "tls_ca_file"),
        private_key=_read_pem(config.tls_key_file, "tls_key_file"),
        certificate_chain=_read_pem(config.tls_cert_file, "tls_cert_file"),
    )
