"""Checkpoint tensors for the loader: HF safetensors files or a GGUF file, behind one protocol."""

from engine.checkpoint.revision import checkpoint_revision
from engine.checkpoint.safetensors_files import checkpoint_files
from engine.checkpoint.tensors import CheckpointTensors, open_checkpoint_tensors

__all__ = [
    "CheckpointTensors",
    "checkpoint_files",
    "checkpoint_revision",
    "open_checkpoint_tensors",
]
