"""Paged attention: the backend contract, per-step metadata and the registered backends.

Importing this package registers ``"torch"`` and, when triton is installed, ``"triton"``.
"""

from importlib.util import find_spec

from engine.attention.backend import AttentionBackend, get_backend, register_backend
from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend

__all__ = [
    "AttentionBackend",
    "AttentionMetadata",
    "TorchAttentionBackend",
    "get_backend",
    "register_backend",
]

if find_spec("triton") is not None:
    from engine.attention.triton_backend import TritonAttentionBackend

    __all__ += ["TritonAttentionBackend"]
