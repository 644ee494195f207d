"""PNG plots of a capacity model (matplotlib, Agg backend): one per curve.

- ``<stem>.prefill.png``: prefill tokens/s against prompt length, one line per batch size;
- ``<stem>.decode.png``: inter-token latency against concurrency, one line per context length.
"""

from __future__ import annotations

from pathlib import Path

from cluster.planner.capacity_model import CapacityModel


def write_profile_plots(model: CapacityModel, stem: Path) -> list[Path]:
    """Write both PNGs next to ``stem``; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = [stem.with_name(stem.name + ".prefill.png"), stem.with_name(stem.name + ".decode.png")]
    fig, ax = plt.subplots(figsize=(6, 4))
    for batch in sorted({p.batch for p in model.prefill}):
        points = sorted((p.prompt_len, p.tokens_per_s) for p in model.prefill if p.batch == batch)
        ax.plot(*zip(*points, strict=True), marker="o", label=f"batch {batch}")
    ax.set(xscale="log", xlabel="prompt tokens", ylabel="prefill tokens/s",
           title=f"Prefill throughput ({model.model}, {model.device})")  # fmt: skip
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths[0])
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for context in sorted({d.context_len for d in model.decode}):
        points = sorted((d.concurrency, d.itl_s * 1000) for d in model.decode
                        if d.context_len == context)  # fmt: skip
        ax.plot(*zip(*points, strict=True), marker="o", label=f"context {context}")
    ax.set(xscale="log", xlabel="running sequences", ylabel="inter-token latency (ms)",
           title=f"Decode step time ({model.model}, {model.device})")  # fmt: skip
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths[1])
    plt.close(fig)
    return paths
