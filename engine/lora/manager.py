"""One engine's adapters: ``max_cpu_loras`` in host memory, ``max_loras`` on the device, LRU
between them, and the step's row -> slot mapping the model's LoRA linears read.

Residency is device (in a slot: its requests run without a copy), host (loaded, copied into a
slot when a step needs it) or cold (not loaded: the next request or step naming it loads it
from disk). A request's adapter is loaded and checked when it is admitted; should it have left
host memory by the time a step runs the request, the step loads it again. Eviction is least
recently used: from host memory, adapters without a device slot go first; from the device,
any adapter the step does not need. The scheduler admits at most ``max_loras`` distinct
adapters into its running set, so a step never needs more slots than there are.
"""

from __future__ import annotations

import enum
import logging
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Protocol

from core.errors import InvalidRequestError
from core.stats import LoRAAdapterStats
from engine.lora.adapter import LoRAAdapter, ServedBase, load_adapter
from engine.lora.request import LoRARequest
from engine.models import CausalLM
from engine.models.lora import (
    BASE_SLOT,
    LoRASlots,
    LoRAStepState,
    LoRATarget,
    attach_lora_slots,
    build_lora_batch,
    lora_targets,
)

logger = logging.getLogger(__name__)


class Residency(enum.Enum):
    """Where an adapter is, nearest first."""

    DEVICE = "device"
    HOST = "host"
    COLD = "cold"


class StepItem(Protocol):
    """What the manager reads of a scheduled request."""

    @property
    def request_id(self) -> str:
        """The request."""
        ...

    @property
    def num_new_tokens(self) -> int:
        """Its rows in the step."""
        ...


class LoRAManager:
    """Loads, places and evicts the adapters of one model (see the module docstring)."""

    def __init__(
        self,
        model: CausalLM,
        *,
        max_loras: int,
        max_cpu_loras: int,
        max_lora_rank: int,
        served: ServedBase,
    ) -> None:
        if max_cpu_loras < max_loras:
            raise ValueError(f"max_cpu_loras ({max_cpu_loras}) < max_loras ({max_loras})")
        self.max_loras = max_loras
        self.max_cpu_loras = max_cpu_loras
        self.max_lora_rank = max_lora_rank
        self.served = served
        self.dtype = model.dtype
        self.device = model.embed_tokens.weight.device
        self.targets = lora_targets(model)
        self.step = LoRAStepState()
        self._slots: dict[tuple[int, str], LoRASlots] = attach_lora_slots(
            model, num_slots=max_loras, max_rank=max_lora_rank, step=self.step
        )
        self._host: OrderedDict[str, LoRAAdapter] = OrderedDict()  # least recent first
        self._device: OrderedDict[str, int] = OrderedDict()  # name -> slot, least recent first
        self._free_slots = list(range(max_loras - 1, -1, -1))
        self._bound: dict[str, LoRARequest] = {}  # request id -> its adapter
        self._requests_total: Counter[str] = Counter()  # adapter -> requests bound, ever
        self._stepped: Counter[str] = Counter()  # adapter -> its requests in the latest step

    # -- adapters ---------------------------------------------------------------------------

    def add_adapter(self, request: LoRARequest) -> LoRAAdapter:
        """The adapter of ``request`` in host memory, loaded (and checked) if it is not; a
        name already loaded from another path or id is refused."""
        return self._load(request, keep=())

    def _load(self, request: LoRARequest, keep: Sequence[str]) -> LoRAAdapter:
        name = request.lora_name
        adapter = self._host.get(name)
        if adapter is not None:
            if (adapter.int_id, adapter.path) != (request.lora_int_id, request.lora_path):
                raise InvalidRequestError(
                    f"adapter {name!r} is loaded as id {adapter.int_id} from {adapter.path}; "
                    f"unload it before loading id {request.lora_int_id} from "
                    f"{request.lora_path}",
                    param="lora_request",
                )
            self._host.move_to_end(name)
            return adapter
        adapter = load_adapter(
            request,
            max_rank=self.max_lora_rank,
            targets=self.targets,
            served=self.served,
            dtype=self.dtype,
        )
        while len(self._host) >= self.max_cpu_loras:
            self._evict(self._host_victim(keep))
        self._host[name] = adapter
        logger.info("LoRA adapter %s loaded (rank %d) from %s", name, adapter.rank, adapter.path)
        return adapter

    def remove_adapter(self, name: str) -> bool:
        """Unload ``name`` from host and device; False when it was not loaded. Refused while
        requests run under it."""
        if name not in self._host:
            return False
        in_use = sum(1 for bound in self._bound.values() if bound.lora_name == name)
        if in_use:
            raise InvalidRequestError(
                f"adapter {name!r} is in use by {in_use} request(s)", param=name
            )
        self._evict(name)
        return True

    def residency(self, name: str) -> Residency:
        """Where ``name`` is now."""
        if name in self._device:
            return Residency.DEVICE
        return Residency.HOST if name in self._host else Residency.COLD

    def residencies(self) -> dict[str, Residency]:
        """Every loaded adapter's residency (cold ones are not listed)."""
        return {name: self.residency(name) for name in self._host}

    def adapter_stats(self) -> tuple[LoRAAdapterStats, ...]:
        """Every loaded adapter's residency and requests, least recently used first."""
        bound = Counter(request.lora_name for request in self._bound.values())
        return tuple(
            LoRAAdapterStats(
                name=name,
                residency=self.residency(name).value,
                requests_total=self._requests_total[name],
                num_running=self._stepped[name],
                num_waiting=max(bound[name] - self._stepped[name], 0),
            )
            for name in self._host
        )

    # -- requests ---------------------------------------------------------------------------

    def bind(self, request_id: str, request: LoRARequest) -> None:
        """``request_id`` runs under ``request``'s adapter (loaded now if needed) until
        :meth:`unbind`."""
        self.add_adapter(request)
        self._bound[request_id] = request
        self._requests_total[request.lora_name] += 1

    def unbind(self, request_id: str) -> None:
        """The request ended (no-op for a base request)."""
        self._bound.pop(request_id, None)

    def adapter_of(self, request_id: str) -> str | None:
        """The adapter a request runs under (None: the base model)."""
        bound = self._bound.get(request_id)
        return None if bound is None else bound.lora_name

    def prepare_step(self, scheduled: Sequence[StepItem]) -> None:
        """Put the step's adapters into device slots and publish its row -> slot mapping to
        the model's LoRA linears (once per step; the layers do no host work)."""
        requests = [self._bound.get(item.request_id) for item in scheduled]
        wanted = {r.lora_name: r for r in requests if r is not None}
        needed = list(wanted)
        if len(needed) > self.max_loras:
            raise ValueError(
                f"a step needs {len(needed)} adapters but max_loras is {self.max_loras}"
            )
        for name, request in wanted.items():
            self._load(request, keep=needed)  # back from disk if it left host memory
            self._place(name, keep=needed)
        names = [None if r is None else r.lora_name for r in requests]
        self._stepped = Counter(n for n in names if n is not None)
        slots = [BASE_SLOT if n is None else self._device[n] for n in names]
        counts = [item.num_new_tokens for item in scheduled]
        self.step.batch = build_lora_batch(counts, slots, self.device)

    # -- placement --------------------------------------------------------------------------

    def _place(self, name: str, keep: Sequence[str]) -> None:
        """``name`` into a device slot (evicting the least recent slot not in ``keep``)."""
        if name in self._device:
            self._device.move_to_end(name)
            return
        if not self._free_slots:
            victim = next(n for n in self._device if n not in keep)
            self._free_slots.append(self._device.pop(victim))
        slot = self._free_slots.pop()
        adapter = self._host[name]
        for (layer_idx, linear), slots in self._slots.items():
            per_segment = [
                adapter.weights.get((layer_idx, target.module))
                for target in self._segment_targets(layer_idx, linear)
            ]
            slots.set_slot(slot, per_segment, adapter.scale)
        self._device[name] = slot

    def _segment_targets(self, layer_idx: int, linear: str) -> list[LoRATarget]:
        found = [t for (i, _), t in self.targets.items() if i == layer_idx and t.linear == linear]
        return sorted(found, key=lambda t: t.segment)

    def _host_victim(self, keep: Sequence[str]) -> str:
        """The least recently used adapter in host memory, one without a device slot first,
        never one in ``keep``."""
        spare = [n for n in self._host if n not in keep]
        return next((n for n in spare if n not in self._device), spare[0])

    def _evict(self, name: str) -> None:
        del self._host[name]
        slot = self._device.pop(name, None)
        if slot is not None:
            self._free_slots.append(slot)
        logger.info("LoRA adapter %s evicted", name)
