"""``model.lora_modules``: the LoRA adapters a served model starts with (vLLM's
``--lora-modules name=path``), one list both of its pools load."""

from __future__ import annotations

from pydantic import Field

from core.config.base import StrictModel


class LoRAModuleConfig(StrictModel):
    """One PEFT adapter served under its own name next to the base model."""

    name: str = Field(
        ...,
        min_length=1,
        pattern=r"^[^\s/:]+$",
        description="The name clients send as `model` (no spaces, slashes or colons); also the "
        "adapter's prefix-cache salt.",
    )
    path: str = Field(
        ...,
        min_length=1,
        description="The adapter directory (adapter_config.json + adapter_model.safetensors), "
        "readable on every node of both pools.",
    )
    base_model_name: str | None = Field(
        None,
        description="The served model this adapter belongs to (vLLM's field; /v1/models lists it "
        "as the adapter's parent); must be the model's served name when set. The adapter's own "
        "base_model_name_or_path is checked against the checkpoint when it loads.",
    )


def check_lora_modules(
    modules: tuple[LoRAModuleConfig, ...], served_name: str, field_path: str
) -> None:
    """Adapter names unique and none naming another base; ValueError naming the field."""
    seen: set[str] = set()
    for index, module in enumerate(modules):
        at = f"{field_path}model.lora_modules[{index}]"
        if module.base_model_name is not None and module.base_model_name != served_name:
            raise ValueError(
                f"{at}.base_model_name: {module.base_model_name!r} is not the served model "
                f"{served_name!r}"
            )
        if module.name in seen:
            raise ValueError(f"{at}.name: {module.name!r} is listed twice")
        seen.add(module.name)
