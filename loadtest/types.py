"""Plain records the load tester passes around: planned sessions and measured requests.

A *session* is the unit an arrival starts: one request for single-shot workloads, several turns
(each resending the conversation so far) for multi-turn ones. A ``RequestRecord`` is one finished
request, successful or not; times are seconds, relative to the benchmark start where noted.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from loadtest.server_timing import ServerTiming


class FailureKind(enum.Enum):
    """Why a request did not count as a success."""

    HTTP_STATUS = "http_status"  # non-200 response
    SSE_ERROR = "sse_error"  # an `event: error` or a data payload carrying "error"
    TRUNCATED = "truncated"  # the stream ended (or broke) without `data: [DONE]`
    TIMEOUT = "timeout"  # the whole request exceeded request_timeout_s
    CONNECTION = "connection_error"  # could not connect / send the request
    EMPTY = "empty_stream"  # [DONE] arrived but no token chunk before it
    INVALID = "invalid_response"  # a data payload that is not JSON


@dataclass(frozen=True)
class Turn:
    """One request of a session: new user text and how many tokens to ask for."""

    text: str
    text_tokens: int
    max_output_tokens: int
    think_time_s: float = 0.0


@dataclass(frozen=True)
class Session:
    """What one arrival sends: turns in order; ``arrival_s`` pins its start (trace replay)."""

    session_id: int
    turns: tuple[Turn, ...]
    system_text: str = ""
    system_tokens: int = 0
    arrival_s: float | None = None
    label: str = ""
    """A request class (``long`` / ``short`` in the long-short mix); empty: unlabelled."""


@dataclass(frozen=True)
class StreamOutcome:
    """What the HTTP client observed for one streamed request (seconds on the loop clock)."""

    success: bool
    start_time_s: float
    ttft_s: float = 0.0
    itl_s: tuple[float, ...] = ()
    latency_s: float = 0.0
    generated_text: str = ""
    num_token_chunks: int = 0
    usage_prompt_tokens: int | None = None
    usage_output_tokens: int | None = None
    failure_kind: FailureKind | None = None
    error: str = ""
    http_status: int | None = None
    server_timing: ServerTiming | None = None


@dataclass(frozen=True)
class RequestRecord:
    """One finished request as the metrics see it."""

    request_id: str
    session_id: int
    turn_index: int
    success: bool
    start_s: float
    queue_s: float
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    latency_s: float
    itl_s: tuple[float, ...] = field(default=())
    failure_kind: FailureKind | None = None
    error: str = ""
    http_status: int | None = None
    max_output_tokens: int = 0
    output_token_source: str = "usage"
    expected_prompt_tokens: int = 0
    """The prompt's length as the load tester planned it (its counter plus the overhead)."""
    prompt_token_source: str = "bench"
    """``usage`` when ``prompt_tokens`` is the server's count, else ``bench`` (planned)."""
    label: str = ""
    """The session's label (``long`` / ``short`` in the long-short mix)."""
    server_timing: ServerTiming | None = None
    """The server's TTFT breakdown (``usage.ttft_breakdown``), when it reported one."""

    @property
    def tpot_s(self) -> float:
        """vLLM's TPOT: (latency - ttft) / (output_tokens - 1); 0 for one or no token."""
        if not self.success or self.output_tokens <= 1:
            return 0.0
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


THROUGHPUT_KEYS = (
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
)
"""The summary's headline counts and rates, in the order every report shows them."""
