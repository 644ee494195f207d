"""pdserve core: pure-Python types every process agrees on (no torch, ray or grpc)."""

from core.errors import PdserveError
from core.hashing import hash_block, hash_prompt_blocks
from core.kv_layout import KVLayout
from core.sampling import SamplingParams

__all__ = ["KVLayout", "PdserveError", "SamplingParams", "hash_block", "hash_prompt_blocks"]
