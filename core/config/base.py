"""The base of every config section, and the names every section shares."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

MIB = 1024 * 1024

DType = Literal["float32", "bfloat16", "float16", "auto"]


class StrictModel(BaseModel):
    """Base for every config section: frozen, unknown keys rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)
