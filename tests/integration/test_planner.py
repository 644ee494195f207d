"""The planner through Serve: a second app on the shared cluster, sized by pdserve's
application-level autoscaling policy, in ``load`` and in ``slo`` mode (with a capacity model
that makes one prefill replica too slow for the burst's TTFT target). A burst of long prompts
grows the prefill pool; once the burst is over it shrinks back; each change is in the decision
log ``pdserve status`` shows. In ``load`` mode the prefill pool starts at zero replicas and
comes back by demand (the prompts queued on decode) before returning to zero. Removed
afterwards, so the shared app is untouched."""

from __future__ import annotations

import itertools
import re
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster.ops.launcher import deploy
from cluster.ops.status_view import planner_log
from cluster.planner.capacity_model import CapacityModel, DecodePoint, PrefillPoint
from cluster.serve.config_file import load_cluster_config
from tests.cluster_fixtures import ServingApp, SimCluster, remove_app
from tests.integration.support import SERVED_NAME, app_config
from tests.waiting import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(420)]

APP = "pdserve-planner"


# One prefill replica is profiled at 200 prompt tokens/s (a 400-token prompt alone takes 2 s,
# within the 4 s target only while it is nearly idle); decode is profiled as never the limit.
SLOW_PREFILL = CapacityModel(
    model="test",
    device="cpu",
    prefill=(PrefillPoint(100, 1, 0.5), PrefillPoint(1000, 1, 5.0)),
    decode=(DecodePoint(1, 64, 0.001), DecodePoint(64, 64, 0.002)),
)


def _planner(mode: str, tmp_path: Path) -> dict[str, Any]:
    if mode == "load":
        return {"mode": "load", "prefill_queue_tokens_per_replica": 256, "max_step": 1}
    profile = tmp_path / "profile.json"
    SLOW_PREFILL.save(profile)
    return {"mode": "slo", "profile": str(profile), "ttft_p90_ms": 4000, "max_step": 1}


# the pool sizes each mode walks through: load mode scales prefill from zero and back
SIZES = {"load": (0, 1), "slo": (1, 2)}


def _planner_config(port: int, planner: dict[str, Any]) -> dict[str, Any]:
    # a 5 s window (Serve's default: 30 s) and a report each second (10 s) so the burst shows
    # in the averages within seconds
    scaling = {
        "min_replicas": 1,
        "max_replicas": 2,
        "upscale_delay_s": 0.0,
        "look_back_period_s": 5.0,
        "metrics_interval_s": 1.0,
    }
    raw = app_config(
        port,
        cluster={"app_name": APP, "route_prefix": "/planner"},
        disaggregation={"local_prefill_threshold_tokens": 16},
        planner=planner,
    )
    for pool in ("prefill", "decode"):
        raw[pool].pop("num_replicas", None)
        raw[pool]["autoscaling"] = {**scaling, "downscale_delay_s": 1.0}
    low, high = SIZES[planner["mode"]]
    raw["prefill"]["autoscaling"].update(min_replicas=low, max_replicas=high)
    return raw


def _target(serving_app: ServingApp, name: str) -> int:
    app = serving_app.rest.app_details(APP) or {}
    return int(app.get("deployments", {}).get(name, {}).get("target_num_replicas", -1))


@pytest.mark.parametrize("mode", ["load", "slo"])
def test_the_planner_grows_prefill_under_a_burst_and_shrinks_it_after(
    mode: str, serving_app: ServingApp, sim_cluster: SimCluster, tmp_path: Path
) -> None:
    raw = _planner_config(serving_app.config.server.port, _planner(mode, tmp_path))
    config = load_cluster_config(raw)
    endpoint = deploy(config, sim_cluster.dashboard_url, timeout_s=300)
    stop = threading.Event()
    failures: list[str] = []

    def client(index: int) -> None:
        with httpx.Client(timeout=120) as http:
            for n in itertools.count():
                if stop.is_set():
                    return
                # distinct prompts: a repeated one would be a prefix hit, prefilled on decode;
                # ~400 tokens (the byte-level tokenizer: one token per byte), as SLOW_PREFILL
                # assumes: longer ones only cost prefill time and drag out the shrink
                prompt = f"client {index} request {n}: " + "long prompt " * 31
                body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": 2}
                response = http.post(f"{endpoint}/v1/completions", json=body)
                if response.status_code not in (200, 429):
                    failures.append(f"{response.status_code} {response.text[:200]}")

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(4)]
    low, high = SIZES[mode]
    try:
        assert _target(serving_app, "Prefill") == low
        for thread in threads:
            thread.start()
        wait_until(lambda: _target(serving_app, "Prefill") == high, 180, "the burst adds prefill")
        stop.set()
        for thread in threads:
            thread.join(120)
        wait_until(lambda: _target(serving_app, "Prefill") == low, 180, "idle prefill shrinks")
        assert not failures, failures
        log = planner_log(APP)
        assert log is not None and log.mode == mode
        prefill = [d for d in log.decisions if d.pool == "Prefill"]
        grew = [(d.previous, d.target) for d in prefill]
        assert (low, high) in grew and grew[-1] == (high, low), log
        if mode == "load":  # from zero, the prompts queued on decode were the demand
            up = next(d for d in prefill if (d.previous, d.target) == (low, high))
            pending = re.search(r"pending_prompt_tokens=([0-9.]+)", up.detail)
            assert up.reason in ("prefill_demand", "step_limit"), up
            assert pending is not None and float(pending.group(1)) > 0, up
    finally:
        stop.set()
        remove_app(serving_app, APP)
