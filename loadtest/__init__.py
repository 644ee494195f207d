"""``pdserve bench``: a load tester for any OpenAI-compatible server (imports only core + httpx).

This package root re-exports the light record types only; import the heavier modules
(``loadtest.bench``, ``.metrics``, ``.sweep`` ...) where they are needed so that
``pdserve --help`` does not pay for httpx/numpy.
"""

from loadtest.types import FailureKind, RequestRecord, Session, StreamOutcome, Turn

__all__ = ["FailureKind", "RequestRecord", "Session", "StreamOutcome", "Turn"]
