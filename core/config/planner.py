"""``planner``: how the prefill and decode pools are sized together, live.

``off`` keeps Serve's own per-deployment autoscaling (ongoing requests per replica). ``load``
installs pdserve's planner as the application's Serve autoscaling policy: it reads each
replica's reported load (pending prompt tokens on prefill; KV usage, running and waiting
sequences on decode) and sets both pools' targets in one decision. ``slo`` sizes the pools for
latency targets instead (``ttft_p90_ms``, ``itl_p90_ms``) from the capacity model
``pdserve profile`` measured (``profile``), the predicted arrival rate and concurrency, and
correction factors learned from the latencies the ingress observes. Serve then applies each
pool's ``autoscaling`` range and its upscale/downscale delays (the cool-downs); ``max_step``
bounds how far one decision moves a pool.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from core.config.base import StrictModel


class PlannerConfig(StrictModel):
    """The planner's mode and its per-pool targets."""

    mode: Literal["off", "load", "slo"] = Field(
        "off",
        description="off: Serve's request-count autoscaling per pool; load: pdserve's planner "
        "sizes both pools from prefill queue tokens and decode KV usage; slo: it sizes them "
        "for ttft_p90_ms and itl_p90_ms from the profile (both need an autoscaling range on "
        "both pools).",
    )
    prefill_queue_tokens_per_replica: int = Field(
        8192,
        ge=1,
        description="Prompt tokens waiting or being prefilled that one prefill replica should "
        "carry; more add replicas.",
    )
    decode_kv_usage_target: float = Field(
        0.7,
        gt=0.0,
        le=1.0,
        description="Mean KV-cache usage the decode pool aims for; above it adds replicas.",
    )
    decode_seqs_per_replica: int | None = Field(
        None,
        ge=1,
        description="Running plus waiting sequences one decode replica should carry; None: "
        "sized by KV usage alone.",
    )
    max_step: int = Field(
        2, ge=1, description="Most replicas one decision adds to or removes from a pool."
    )
    ttft_p90_ms: float = Field(
        2000.0, gt=0.0, description="slo: time-to-first-token target (90th percentile), ms."
    )
    itl_p90_ms: float = Field(
        100.0, gt=0.0, description="slo: inter-token latency target (90th percentile), ms."
    )
    profile: str | None = Field(
        None,
        description="slo: the capacity model `pdserve profile` wrote (a JSON path; relative "
        "paths are read from the directory `pdserve up` runs in).",
    )
    prediction_horizon_s: float = Field(
        30.0,
        ge=0.0,
        description="slo: how far ahead the arrival rate and concurrency are extrapolated from "
        "their recent trend (about a replica's start-up time); 0: size for the load now.",
    )

    @model_validator(mode="after")
    def _slo_needs_a_profile(self) -> PlannerConfig:
        if self.mode == "slo" and not self.profile:
            raise ValueError(
                "planner.mode 'slo' needs planner.profile (the JSON `pdserve profile` writes)"
            )
        return self
