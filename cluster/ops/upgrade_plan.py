"""What ``pdserve upgrade CONFIG`` would change on a running cluster, decided before anything
moves: pure functions of the running config and the new one (no Ray).

:func:`plan_upgrade` sorts every difference. Sections no replica's engine reads (``routing``,
``disaggregation``, ``planner``, ``virtual_models``) and a pool's size keep every replica's KV
fingerprint; of those, the fields ``cluster.serve.in_place`` lists apply in place (the routing
knobs, the planner's thresholds, what the ingress reads), the others — the KV index's shards
and stride, the planner's mode and profile — only through a redeploy. A served model
whose checkpoint, engine options, pool engine overrides or transfer settings changed has both
its pools replaced — the new replicas compute
KV of another fingerprint (``core.kv_compat``), and pairing by fingerprint keeps the two
versions apart while both serve. What cannot be upgraded to is refused with
:class:`~core.errors.UpgradeRefusedError` naming it: another cluster or server section (that is
another deployment: ``pdserve down`` then ``up``), another set of served models, or a model of
another architecture or vocabulary (the ingress's tokenizer and every client's token ids would
change under it).

:func:`rolling_steps` is the order a pool pair is replaced in: one replica at a time, always in
the pool whose new version lags the config's P:D ratio most, so both versions keep the ratio
within one replica at every step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cluster.serve.in_place import applies_in_place, field_value
from core.config import ClusterConfig, ServedModel
from core.errors import UpgradeRefusedError

IN_PLACE_SECTIONS = ("routing", "disaggregation", "planner", "virtual_models")
"""Sections no replica's engine reads (a change in them alone keeps every KV fingerprint)."""
_SPLIT_SECTIONS = ("routing", "planner")
REFUSED_SECTIONS = ("cluster", "server")
"""Sections an upgrade keeps (another value is another deployment)."""


@dataclass(frozen=True)
class ModelIdentity:
    """What a served model's checkpoint must keep across an upgrade."""

    architecture: str
    vocab_size: int


ArchitectureOf = Callable[[str], ModelIdentity]
"""A model name or path -> its architecture and vocabulary (reads its ``config.json``)."""


@dataclass(frozen=True)
class ModelUpgrade:
    """One served model's part of an upgrade."""

    name: str
    restart_reasons: tuple[str, ...]
    """What changed that needs new replicas (empty: none restarts)."""
    num_prefill: int | None
    """The new config's fixed prefill replicas (None: autoscaled)."""
    num_decode: int | None

    @property
    def restarts(self) -> bool:
        """Both pools are replaced."""
        return bool(self.restart_reasons)


@dataclass(frozen=True)
class UpgradePlan:
    """Every change between the running config and the new one."""

    in_place: tuple[str, ...]
    """Sections that change without a restart."""
    models: tuple[ModelUpgrade, ...]
    ingress_fields: tuple[str, ...] = ()
    """Changed fields applied through the ingress's ``reconfigure``, which hands the routing
    knobs to the routers and the planner's settings to the planner (``cluster.serve.in_place``)."""
    redeploy_fields: tuple[str, ...] = ()
    """Changed fields of :data:`IN_PLACE_SECTIONS` that only a redeploy applies (replicas read
    them, or they change the app's shape), which restarts every replica."""

    @property
    def restarts(self) -> bool:
        """Some replicas are replaced."""
        return any(m.restarts for m in self.models)

    @property
    def empty(self) -> bool:
        """Nothing changes."""
        return not self.in_place and not any(
            m.restarts or m.num_prefill is not None or m.num_decode is not None for m in self.models
        )


def plan_upgrade(
    current: ClusterConfig, new: ClusterConfig, identity_of: ArchitectureOf
) -> UpgradePlan:
    """The plan from ``current`` to ``new``; raises :class:`UpgradeRefusedError` (see the
    module docstring)."""
    for section in REFUSED_SECTIONS:
        if getattr(current, section) != getattr(new, section):
            raise UpgradeRefusedError(
                f"an upgrade keeps the {section}: section; changing it is another deployment "
                "(pdserve down, then pdserve up with the new config)",
                param=section,
            )
    running = {m.name: m for m in current.served_models()}
    wanted = {m.name: m for m in new.served_models()}
    if set(running) != set(wanted):
        raise UpgradeRefusedError(
            f"an upgrade keeps the served models: running {sorted(running)}, the new config "
            f"serves {sorted(wanted)} (a new checkpoint keeps its name through served_name)",
            param="models",
        )
    in_place = tuple(s for s in IN_PLACE_SECTIONS if getattr(current, s) != getattr(new, s))
    models = tuple(
        _model_upgrade(running[name], wanted[name], current, new, identity_of)
        for name in sorted(wanted)
    )
    changed = _changed_fields(current, new, in_place)
    ingress = tuple(f for f in changed if applies_in_place(f))
    redeploy = tuple(f for f in changed if not applies_in_place(f))
    return UpgradePlan(in_place, models, ingress, redeploy)


def _changed_fields(
    current: ClusterConfig, new: ClusterConfig, sections: tuple[str, ...]
) -> tuple[str, ...]:
    """The changed fields of ``sections``: a whole section, or the own fields of those split
    between what applies in place and what needs a redeploy (``routing``, ``planner``)."""
    fields: list[str] = []
    for section in sections:
        if section not in _SPLIT_SECTIONS:
            fields.append(section)
            continue
        for name in type(getattr(current, section)).model_fields:
            path = f"{section}.{name}"
            if field_value(current, path) != field_value(new, path):
                fields.append(path)
    return tuple(fields)


def _model_upgrade(
    old: ServedModel,
    new: ServedModel,
    current: ClusterConfig,
    config: ClusterConfig,
    identity_of: ArchitectureOf,
) -> ModelUpgrade:
    reasons: list[str] = []
    if old.model != new.model:
        before, after = identity_of(old.model.name), identity_of(new.model.name)
        if before != after:
            raise UpgradeRefusedError(
                f"model {new.name}: the new checkpoint {new.model.name!r} is {after}, the running "
                f"one {old.model.name!r} is {before}; an upgrade keeps the architecture and "
                "vocabulary (serve it as another model)",
                param=f"{new.field_path}model.name",
            )
        reasons.append("model")
    if old.engine != new.engine:
        reasons.append("engine")
    for role in ("prefill", "decode"):
        if getattr(old, role).engine != getattr(new, role).engine:
            reasons.append(f"{role}.engine")
    if current.transfer != config.transfer:
        reasons.append("transfer")
    return ModelUpgrade(
        new.name,
        tuple(reasons),
        _fixed(new.prefill.num_replicas, old.prefill.num_replicas),
        _fixed(new.decode.num_replicas, old.decode.num_replicas),
    )


def _fixed(new: int | None, old: int | None) -> int | None:
    """A pool's new fixed size when it changed (None: unchanged, or autoscaled)."""
    return new if new is not None and new != old else None


@dataclass(frozen=True)
class RollingStep:
    """Replicas of the new version after one step of a rolling upgrade."""

    num_new_prefill: int
    num_new_decode: int


def rolling_steps(num_prefill: int, num_decode: int) -> list[RollingStep]:
    """One replica replaced per step, from none new to every one; at every step both versions
    are within one replica of the config's P:D ratio (:func:`ratio_deviation`)."""
    if num_prefill < 0 or num_decode < 1:
        raise ValueError(f"pools of {num_prefill} prefill and {num_decode} decode replicas")
    steps, p, d = [], 0, 0
    while p < num_prefill or d < num_decode:
        # NOTE: compare p/P with d/D in integers: replace in the pool that lags behind
        if d >= num_decode or (p < num_prefill and p * num_decode <= d * num_prefill):
            p += 1
        else:
            d += 1
        steps.append(RollingStep(p, d))
    return steps


def ratio_deviation(
    num_prefill: int, num_decode: int, config_prefill: int, config_decode: int
) -> float:
    """How far one version's pools are off the config's P:D ratio, in replicas of the larger
    pool: ``|p * D - d * P| / max(P, D)`` (0 on the ratio; at most 1 through
    :func:`rolling_steps`)."""
    scale = max(config_prefill, config_decode, 1)
    return abs(num_prefill * config_decode - num_decode * config_prefill) / scale
