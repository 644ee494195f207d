"""CUDA graphs for decode: bucket arithmetic, static buffers, capture and replay."""

from engine.cuda_graphs.buckets import (
    PaddedDecode,
    default_batch_sizes,
    graph_batch_sizes,
    moe_syncs_host,
    pad_decode,
    pick_bucket,
)
from engine.cuda_graphs.buffers import DecodeBuffers
from engine.cuda_graphs.runner import CudaGraphRunner, DecodeStep

__all__ = [
    "CudaGraphRunner",
    "DecodeBuffers",
    "DecodeStep",
    "PaddedDecode",
    "default_batch_sizes",
    "graph_batch_sizes",
    "moe_syncs_host",
    "pad_decode",
    "pick_bucket",
]
