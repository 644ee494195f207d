"""The planner's settings an in-place upgrade changes: the ingress publishes, the policy reads.

Serve builds the app-level autoscaling policy (:class:`~cluster.serve.planner_policy.
PdservePlanner`) once, on its controller, from ``policy_kwargs``; a new value of those kwargs is
part of the app's code version and restarts every replica. So ``pdserve upgrade`` of the
``planner`` section (its mode and profile aside) or of ``disaggregation`` rides the ingress's
``user_config`` like the other in-place fields, and the ingress writes the result to the GCS
key :func:`settings_key` (:func:`publish`), where the policy reads it once per
:data:`READ_PERIOD_S` (:func:`read`).

The value names the settings it overrides (``base``: what the app was deployed with). A policy
takes it only when that base is its own and the mode and profile are unchanged, so a value left
from an earlier deployment of the same app name, or a hand-made one that would need another
policy, is ignored.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from cluster.planner.decisions import decisions_key
from core.config import ClusterConfig, DisaggregationConfig, PlannerConfig

logger = logging.getLogger(__name__)

READ_PERIOD_S = 1.0
"""How often the policy looks for new settings (one GCS read)."""


@dataclass(frozen=True)
class PlannerSettings:
    """What the planner decides by."""

    planner: PlannerConfig
    disaggregation: DisaggregationConfig

    @classmethod
    def of(cls, config: ClusterConfig) -> PlannerSettings:
        """A cluster config's planner settings."""
        return cls(config.planner, config.disaggregation)

    def to_json(self) -> dict[str, Any]:
        """The JSON-shaped settings (``policy_kwargs``' ``planner`` and ``disaggregation``)."""
        return {
            "planner": self.planner.model_dump(mode="json"),
            "disaggregation": self.disaggregation.model_dump(mode="json"),
        }

    def replaceable_by(self, other: PlannerSettings) -> bool:
        """``other`` runs in the policy built for ``self`` (same mode and capacity profile)."""
        return (other.planner.mode, other.planner.profile) == (
            self.planner.mode,
            self.planner.profile,
        )


def settings_key(app_name: str) -> bytes:
    """The GCS key an app's ingress publishes its planner settings under."""
    return f"pdserve/planner-settings/{app_name}".encode()


def encode(base: PlannerSettings, live: PlannerSettings) -> bytes:
    """The stored value: ``live`` and the ``base`` it overrides."""
    return json.dumps({"base": base.to_json(), "live": live.to_json()}).encode()


def decode(value: bytes, base: PlannerSettings) -> PlannerSettings | None:
    """The live settings in ``value`` if they override ``base`` and its policy can take them;
    None otherwise (another deployment's value, another mode, or unreadable)."""
    try:
        data = json.loads(value)
        stored = _settings(data["base"])
        live = _settings(data["live"])
    except (ValueError, KeyError, TypeError, ValidationError) as e:
        logger.warning("unreadable planner settings ignored: %s", e)
        return None
    if stored != base or not base.replaceable_by(live):
        return None
    return live


def _settings(data: dict[str, Any]) -> PlannerSettings:
    return PlannerSettings(
        PlannerConfig.model_validate(data["planner"]),
        DisaggregationConfig.model_validate(data["disaggregation"]),
    )


def publish(app_name: str, base: PlannerSettings, live: PlannerSettings) -> None:
    """Write ``live`` (overriding ``base``) for ``app_name``'s planner (needs a Ray worker)."""
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put(settings_key(app_name), encode(base, live), overwrite=True)


def forget(app_name: str) -> None:
    """Delete what ``app_name``'s planner left in the GCS (its published settings and its
    decision log), so a later app of that name starts clean (needs a Ray worker)."""
    from ray.experimental.internal_kv import _internal_kv_del

    for key in (settings_key(app_name), decisions_key(app_name)):
        _internal_kv_del(key)


def read(app_name: str, base: PlannerSettings) -> PlannerSettings | None:
    """What ``app_name``'s ingress published over ``base`` (None: nothing it can take, or no
    Ray here)."""
    from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized

    if not _internal_kv_initialized():
        return None
    value = _internal_kv_get(settings_key(app_name))
    return None if value is None else decode(value, base)
