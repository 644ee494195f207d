"""The planner's settings changed in place: the stored value round-trips, is taken only over the
settings the policy was deployed with and with the same mode, and the Serve policy decides by
what was published from its next read on (once a second), keeping what it has when a read
fails."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from cluster.serve import planner_settings
from cluster.serve.planner_policy import PdservePlanner
from cluster.serve.planner_settings import PlannerSettings, decode, encode
from core.config import DisaggregationConfig, PlannerConfig
from tests.unit.cluster.planner.serve_context import FakeContext, FakeId

pytestmark = pytest.mark.timeout(10)

DEPLOYED = PlannerSettings(
    PlannerConfig(mode="load", prefill_queue_tokens_per_replica=1000, max_step=2),
    DisaggregationConfig(),
)
FASTER = PlannerSettings(
    PlannerConfig(mode="load", prefill_queue_tokens_per_replica=500, max_step=4),
    DisaggregationConfig(local_prefill_threshold_tokens=8),
)


def test_a_value_round_trips_over_the_settings_it_was_published_over() -> None:
    assert decode(encode(DEPLOYED, FASTER), DEPLOYED) == FASTER


def test_a_value_over_other_settings_or_for_another_mode_is_ignored() -> None:
    assert decode(encode(FASTER, DEPLOYED), DEPLOYED) is None  # another deployment's value
    slo = PlannerSettings(PlannerConfig(mode="slo", profile="p.json"), DisaggregationConfig())
    assert decode(encode(DEPLOYED, slo), DEPLOYED) is None
    assert decode(b"{not json", DEPLOYED) is None
    assert decode(b'{"base": {}, "live": {}}', DEPLOYED) is None


def test_without_ray_nothing_is_read() -> None:
    assert planner_settings.read("pdserve", DEPLOYED) is None


def test_what_the_ingress_publishes_is_what_the_policy_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ray.experimental import internal_kv

    store: dict[bytes, bytes] = {}
    monkeypatch.setattr(internal_kv, "_internal_kv_initialized", lambda: True)
    monkeypatch.setattr(internal_kv, "_internal_kv_get", store.get)
    monkeypatch.setattr(
        internal_kv, "_internal_kv_put", lambda k, v, overwrite: store.__setitem__(k, v)
    )
    assert planner_settings.read("pdserve", DEPLOYED) is None
    planner_settings.publish("pdserve", DEPLOYED, FASTER)
    assert planner_settings.read("pdserve", DEPLOYED) == FASTER
    assert planner_settings.read("other-app", DEPLOYED) is None


@dataclass
class Published:
    """A stand-in for the GCS: what the ingress published, and the reads."""

    settings: PlannerSettings | None = None
    fail: bool = False
    reads: list[str] = field(default_factory=list)

    def read(self, app_name: str, deployed: PlannerSettings) -> PlannerSettings | None:
        self.reads.append(app_name)
        if self.fail:
            raise ConnectionError("GCS unreachable")
        assert deployed == DEPLOYED
        return self.settings


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    now = [100.0]
    monkeypatch.setattr("cluster.serve.planner_policy._clock", lambda: now[0])
    yield now


def prefill_target(planner: PdservePlanner) -> int:
    contexts = {FakeId("Prefill"): FakeContext(1, 1, {"pending_prompt_tokens": {"a": 2500.0}})}
    targets, _ = planner(contexts)
    return next(iter(targets.values()))


def test_the_policy_decides_by_what_was_published_from_its_next_read(
    clock: list[float],
) -> None:
    published = Published()
    planner = PdservePlanner(
        DEPLOYED.planner.model_dump(mode="json"),
        disaggregation=DEPLOYED.disaggregation.model_dump(mode="json"),
        read_settings=published.read,
    )
    assert prefill_target(planner) == 3  # 2,500 tokens / 1,000 per replica
    published.settings = FASTER
    clock[0] += 0.5
    assert prefill_target(planner) == 3 and published.reads == ["pdserve"]  # not read yet
    clock[0] += 0.5
    assert prefill_target(planner) == 5  # 2,500 / 500, a step of up to 4
    assert planner.config == FASTER.planner and planner.disaggregation == FASTER.disaggregation
    published.fail = True
    clock[0] += 1.0
    assert prefill_target(planner) == 5  # a failed read keeps the settings in use
    published.fail, published.settings = False, None
    clock[0] += 1.0
    assert prefill_target(planner) == 3  # nothing published any more: the deployed settings
    assert published.reads == ["pdserve"] * 4
