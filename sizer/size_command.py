"""``pdserve size``: the typer command. Only typer/rich at import; the sizer loads on call."""

from __future__ import annotations

import json

import typer
from rich.console import Console

from core.console import fail
from core.errors import PdserveError


def _parse_lengths(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as e:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}") from e


def size_command(
    model: str = typer.Option(
        ..., "--model", help="Preset (e.g. Qwen2.5-7B), model directory, or builtin:NAME."
    ),
    kv_dtype: str = typer.Option("auto", "--kv-dtype", help="auto|fp32|fp16|bf16|fp8|int8."),
    weight_dtype: str = typer.Option(
        "auto", "--weight-dtype", help="auto|fp32|fp16|bf16|fp8|int8|int4."
    ),
    gpu: str = typer.Option(
        "h100", "--gpu", help="h100|h200|a100-80gb|a100-40gb|l40s|mi300x (memory, FLOPs, HBM)."
    ),
    gpu_memory_gb: float | None = typer.Option(
        None, "--gpu-memory-gb", help="Override the GPU's memory (decimal GB)."
    ),
    memory_utilization: float = typer.Option(
        0.9, "--memory-utilization", help="Fraction of the memory left after weights for KV."
    ),
    weights_gb: float | None = typer.Option(
        None, "--weights-gb", help="Measured weight memory (GB) instead of params x dtype."
    ),
    tensor_parallel_size: int | None = typer.Option(
        None, "--tp", "--tensor-parallel-size", help="GPUs per replica; default: smallest fit."
    ),
    context_len: int = typer.Option(
        8192, "--context-len", help="Tokens per request held in KV (prompt + output)."
    ),
    output_len: int = typer.Option(512, "--output-len", help="Output tokens (for the split)."),
    concurrency: int | None = typer.Option(
        None, "--concurrency", help="Target concurrent requests -> GPUs needed."
    ),
    block_size: int = typer.Option(16, "--block-size", help="KV block size in tokens."),
    table_context_lens: str = typer.Option(
        "2048,8192,32768,131072", "--table-context-lens", help="Context lengths of the table."
    ),
    host_gb: float | None = typer.Option(
        None, "--host-gb", help="Host-RAM KV tier per replica (GB): sessions it keeps warm."
    ),
    disk_gb: float | None = typer.Option(
        None, "--disk-gb", help="Disk KV tier per replica (GB): sessions it keeps warm."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for machines."),
) -> None:
    """Size the KV cache: bytes per token, requests per GPU, sessions per KV tier, GPUs
    needed, P/D split."""
    from sizer.render import render_report
    from sizer.sizing import SizingRequest, size_model

    request = SizingRequest(
        model=model,
        gpu=gpu,
        gpu_memory_gb=gpu_memory_gb,
        memory_utilization=memory_utilization,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        weights_gb=weights_gb,
        tensor_parallel_size=tensor_parallel_size,
        context_len_tokens=context_len,
        output_len_tokens=output_len,
        target_concurrency=concurrency,
        block_size_tokens=block_size,
        table_context_lens=_parse_lengths(table_context_lens),
        host_gb=host_gb,
        disk_gb=disk_gb,
    )
    try:
        result = size_model(request)
    except PdserveError as e:
        fail(e.message)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        render_report(result, Console())
