"""GGUF checkpoints: checked opening, metadata as HF config and tokenizer files, dequantized
tensors under HF names."""

from engine.gguf.file import GGUFFile, is_gguf_path
from engine.gguf.gguf_tensors import GGUFTensors
from engine.gguf.sidecar import gguf_file_of, is_current, write_sidecar

__all__ = ["GGUFFile", "GGUFTensors", "gguf_file_of", "is_current", "is_gguf_path", "write_sidecar"]
