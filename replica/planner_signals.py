"""What a replica reports to the planner through Serve's ``record_autoscaling_stats`` hook.

Serve averages each reported number over its look-back window, per replica; the planner
(``cluster.serve.planner_policy``) sums or averages them over the pool. Besides the instant
load (pending prompt tokens, KV usage, running and waiting sequences) the ``slo`` planner needs
rates, which a replica derives from its own counters between two calls: uncached prompt tokens
arriving per second (computed plus still pending, so a prefix hit costs nothing) and their mean
per request, and the mean context of a running sequence.
"""

from __future__ import annotations

import time

from core.stats import ReplicaStats


class PlannerSignals:
    """Turns successive :class:`ReplicaStats` into the planner's per-replica numbers."""

    def __init__(self) -> None:
        self._last: tuple[float, int, int] | None = None  # (time, arrived tokens, requests)
        self._prompt_len = 0.0

    def report(self, stats: ReplicaStats, now_s: float | None = None) -> dict[str, float]:
        """The planner's numbers for one report of ``stats``."""
        now_s = time.monotonic() if now_s is None else now_s
        arrived = stats.prefill_tokens_total + stats.pending_prompt_tokens
        rate = 0.0
        if self._last is not None and now_s > self._last[0]:
            then_s, then_tokens, then_requests = self._last
            new_tokens = max(arrived - then_tokens, 0)
            rate = new_tokens / (now_s - then_s)
            new_requests = stats.requests_total - then_requests
            if new_requests > 0:
                self._prompt_len = new_tokens / new_requests
        self._last = (now_s, arrived, stats.requests_total)
        total = stats.kv_blocks_total
        running = stats.num_running
        return {
            "pending_prompt_tokens": float(stats.pending_prompt_tokens),
            "kv_usage": stats.kv_blocks_used / total if total else 0.0,
            "running": float(running),
            # NOTE: a decode import waiting for its KV pull is no queue a new replica would drain
            "waiting": float(max(stats.num_waiting - stats.num_waiting_for_kv, 0)),
            "prompt_tokens_rate": rate,
            "prompt_len": self._prompt_len,
            "context_len": stats.kv_blocks_used * stats.kv_block_size / running if running else 0.0,
        }
