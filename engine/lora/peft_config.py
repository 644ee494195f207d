"""Reads a PEFT adapter's ``adapter_config.json`` into what the engine needs, refusing what it
cannot apply with one typed error each.

Supported: ``peft_type`` LORA, one ``r`` and ``lora_alpha`` for every module (scale
``lora_alpha / r``, or ``lora_alpha / sqrt(r)`` with ``use_rslora``), ``target_modules`` among
q/k/v/o and gate/up/down (a list; a regex string is read from the tensors instead),
``lora_dropout`` (inert at inference). Refused: ``bias`` other than ``none``, ``use_dora``,
``modules_to_save``, ``rank_pattern``/``alpha_pattern``, ``fan_in_fan_out``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import LoRAConfigError, LoRAFileError

CONFIG_FILE = "adapter_config.json"


@dataclass(frozen=True)
class PeftLoRAConfig:
    """The parts of ``adapter_config.json`` the engine applies."""

    rank: int
    scale: float
    target_modules: tuple[str, ...] | None  # None: a regex, judged from the tensors
    base_model: str | None


def read_peft_config(adapter_dir: Path, name: str) -> PeftLoRAConfig:
    """The adapter's config; :class:`LoRAFileError` when missing or not JSON,
    :class:`LoRAConfigError` for an option pdserve cannot apply."""
    path = adapter_dir / CONFIG_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise LoRAFileError(
            f"adapter {name!r}: no {CONFIG_FILE} in {adapter_dir}", param=name
        ) from e
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LoRAFileError(f"adapter {name!r}: cannot read {path}: {e}", param=name) from e
    if not isinstance(raw, dict):
        raise LoRAFileError(f"adapter {name!r}: {path} is not a JSON object", param=name)
    _refuse_unsupported(raw, name)
    rank, alpha = raw.get("r"), raw.get("lora_alpha", raw.get("r"))
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, int | float):
        raise LoRAConfigError(
            f"adapter {name!r}: r must be a positive integer and lora_alpha a number "
            f"(got r={rank!r}, lora_alpha={alpha!r})",
            param=name,
        )
    scale = alpha / math.sqrt(rank) if raw.get("use_rslora") else alpha / rank
    targets = raw.get("target_modules")
    base = raw.get("base_model_name_or_path") or None
    return PeftLoRAConfig(
        rank=rank,
        scale=float(scale),
        target_modules=tuple(targets) if isinstance(targets, list) else None,
        base_model=str(base) if base is not None else None,
    )


def _refuse_unsupported(raw: dict[str, Any], name: str) -> None:
    checks = {
        "peft_type": raw.get("peft_type", "LORA") not in ("LORA", None),
        "bias": raw.get("bias", "none") not in ("none", None),
        "use_dora": bool(raw.get("use_dora")),
        "modules_to_save": bool(raw.get("modules_to_save")),
        "rank_pattern": bool(raw.get("rank_pattern")),
        "alpha_pattern": bool(raw.get("alpha_pattern")),
        "fan_in_fan_out": bool(raw.get("fan_in_fan_out")),
    }
    for key, refused in checks.items():
        if refused:
            raise LoRAConfigError(
                f"adapter {name!r}: {key}={raw.get(key)!r} is not supported", param=name
            )
