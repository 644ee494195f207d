"""Human-readable output of ``pdserve size``: rich tables with binary (KiB/GiB) and decimal GB."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from sizer.sizing import SizingResult

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(num_bytes: float) -> str:
    """``57344`` -> ``56.0 KiB``; binary units, one decimal."""
    value = float(num_bytes)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{value:.1f} {unit}" if unit != "B" else f"{int(value)} B"
        value /= 1024
    raise AssertionError("unreachable")


def _gb(num_bytes: float) -> str:
    return f"{num_bytes / 1e9:.2f} GB"


def _facts_table(result: SizingResult) -> Table:
    shape, inputs, plan = result.shape, result.inputs, result.plan
    table = Table(title=f"{shape.name} on {result.gpu.name}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    attention = (
        f"MLA, latent {shape.mla_latent_dim} per layer"
        if shape.is_mla
        else f"{shape.num_attention_heads} heads / {shape.num_kv_heads} KV heads "
        f"(GQA {shape.gqa_ratio:g}x), head_dim {shape.head_dim}"
    )
    active_b = shape.num_active_params / 1e9
    rows = [
        ("layers / attention", f"{shape.num_layers} / {attention}"),
        ("parameters", f"{shape.num_params / 1e9:.2f}B ({active_b:.2f}B active per token)"),
        ("dtypes", f"weights {inputs.weight_dtype}, KV {inputs.kv_dtype}"),
        ("KV per token", f"{plan.kv_bytes_per_token:,} B ({human_bytes(plan.kv_bytes_per_token)})"),
        ("tensor parallel", f"{plan.tensor_parallel_size} GPU(s) per replica"),
        ("weights per GPU", _gb(plan.weight_bytes_per_gpu)),
        (
            "KV budget per GPU",
            f"{_gb(plan.kv_budget_bytes_per_gpu)} = ({_gb(inputs.gpu_memory_bytes)} - weights)"
            f" x {inputs.memory_utilization:g}",
        ),
        (
            f"KV per {inputs.context_len_tokens}-token request",
            f"{human_bytes(plan.kv_bytes_per_request)} ({_gb(plan.kv_bytes_per_request)})",
        ),
        ("max concurrent requests", f"{plan.max_concurrent_requests} per replica"),
    ]
    if plan.gpus_needed is not None:
        rows.append(
            (
                f"GPUs for {inputs.target_concurrency} concurrent",
                f"{plan.gpus_needed} ({plan.replicas_needed} replica(s)); "
                f"KV {_gb(plan.kv_bytes_for_target or 0)}",
            )
        )
    for name, value in rows:
        table.add_row(name, value)
    return table


def _capacity_table(result: SizingResult) -> Table:
    table = Table(title="Capacity by context length (one replica)")
    lower = [tier for tier in result.tiers if tier.medium != "device"]
    columns = ["context", "KV per request", "max concurrent"]
    columns += [f"{tier.medium} sessions" for tier in lower]
    for column in (*columns, "note"):
        table.add_column(column, justify="right" if column != "note" else "left")
    for index, row in enumerate(result.plan.table):
        note = "" if row.within_model_limit else "beyond the model's context"
        table.add_row(
            f"{row.context_len_tokens:,}",
            human_bytes(row.kv_bytes_per_request),
            str(row.max_concurrent_requests),
            *(f"{tier.sessions_by_context[index][1]:,}" for tier in lower),
            note,
        )
    return table


def _tiers_line(result: SizingResult) -> str | None:
    if len(result.tiers) < 2:
        return None
    parts = [
        f"{tier.medium} {_gb(tier.bytes_per_replica)}: {tier.sessions:,}" for tier in result.tiers
    ]
    return (
        f"[bold]Sessions of {result.inputs.context_len_tokens} tokens per replica[/]: "
        + "; ".join(parts)
        + f"; {sum(t.sessions for t in result.tiers):,} warm in all"
    )


def render_report(result: SizingResult, console: Console) -> None:
    """Print the facts, the capacity table and the suggested prefill/decode split."""
    console.print(_facts_table(result))
    console.print(_capacity_table(result))
    tiers = _tiers_line(result)
    if tiers is not None:
        console.print(tiers, highlight=False)
    split = result.split
    console.print(
        f"[bold]Suggested split[/]: {split.prefill_gpus} prefill GPU(s) "
        f"({split.prefill_replicas} replica(s)) : {split.decode_gpus} decode GPU(s) "
        f"({split.decode_replicas} replica(s)) for ~{split.request_rate_per_s:.2f} req/s of "
        f"{split.input_len_tokens} in / {split.output_len_tokens} out tokens "
        "(roofline heuristic, see sizer/split.py; confirm with pdserve bench)",
        highlight=False,
    )
