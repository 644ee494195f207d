"""``pdserve bench`` and ``pdserve bench compare``: typer declarations only.

Flags follow ``vllm bench serve`` where both tools have the feature (same names, same meaning);
``--goodput`` takes ``KEY:MS`` pairs repeated (``--goodput ttft:500 --goodput tpot:50``) or in
one quoted string (``--goodput "ttft:500 tpot:50"``); percentiles are reported for ttft, tpot,
itl and e2el unless ``--percentile-metrics`` narrows them. Before sending, the workload is
checked against the server's ``max_model_len`` (``--no-preflight`` skips it). Exit status: 0,
1 when no request succeeded (the failures, grouped, are printed), 2 for bad flags or configs
or a workload that cannot fit. The work happens in ``command.py``, imported when a
command runs, so ``pdserve --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from core.console import fail
from core.errors import PdserveError

bench_app = typer.Typer(
    name="bench",
    help="Load-test an OpenAI-compatible server (vllm bench serve flags); see also `compare`.",
    invoke_without_command=True,
    no_args_is_help=False,
    pretty_exceptions_enable=False,
    add_completion=False,
)
_BACKEND_ENDPOINTS = {
    "openai": "/v1/completions",
    "vllm": "/v1/completions",
    "openai-chat": "/v1/chat/completions",
}


@bench_app.callback()
def bench(
    ctx: typer.Context,
    workload: str | None = typer.Option(
        None, "--workload", help="Workload YAML (or a name in configs/loadtest/)."
    ),
    base_url: str | None = typer.Option(None, "--base-url", help="Server root URL."),
    host: str | None = typer.Option(None, "--host", help="Server host (without --base-url)."),
    port: int | None = typer.Option(None, "--port", help="Server port (without --base-url)."),
    endpoint: str | None = typer.Option(None, "--endpoint", help="Default /v1/completions."),
    backend: str = typer.Option("openai", "--backend", help="openai | openai-chat | vllm."),
    model: str | None = typer.Option(None, "--model", help="Default: first of /v1/models."),
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="tokenizer.json, its dir, a GGUF file or builtin:NAME (exact counts).",
    ),
    api_key: str | None = typer.Option(None, "--api-key", help="Bearer token to send."),
    dataset_name: str | None = typer.Option(
        None,
        "--dataset-name",
        help="random | long-32k | long-128k | long-short-mix | shared-prefix | multi-turn | "
        "mooncake-trace.",
    ),
    dataset_path: str | None = typer.Option(None, "--dataset-path", help="Mooncake JSONL."),
    random_input_len: int | None = typer.Option(None, "--random-input-len"),
    random_output_len: int | None = typer.Option(None, "--random-output-len"),
    random_range_ratio: float | None = typer.Option(None, "--random-range-ratio"),
    random_prefix_len: int | None = typer.Option(None, "--random-prefix-len"),
    num_prompts: int | None = typer.Option(None, "--num-prompts", help="Requests (sessions)."),
    seed: int | None = typer.Option(None, "--seed"),
    request_rate: float | None = typer.Option(None, "--request-rate", help="req/s; inf."),
    burstiness: float | None = typer.Option(None, "--burstiness", help="1 = Poisson."),
    max_concurrency: int | None = typer.Option(None, "--max-concurrency"),
    duration_s: float | None = typer.Option(None, "--duration", help="Seconds of arrivals."),
    ramp_up_strategy: str | None = typer.Option(None, "--ramp-up-strategy"),
    ramp_up_start_rps: float | None = typer.Option(None, "--ramp-up-start-rps"),
    ramp_up_end_rps: float | None = typer.Option(None, "--ramp-up-end-rps"),
    ignore_eos: bool | None = typer.Option(None, "--ignore-eos/--no-ignore-eos"),
    temperature: float | None = typer.Option(None, "--temperature"),
    request_timeout_s: float | None = typer.Option(None, "--request-timeout"),
    goodput: list[str] = typer.Option([], "--goodput", help="SLO KEY:MS (ttft|tpot|e2el)."),
    percentile_metrics: str | None = typer.Option(None, "--percentile-metrics"),
    metric_percentiles: str = typer.Option("99", "--metric-percentiles"),
    label: str | None = typer.Option(None, "--label", help="Run label (file names)."),
    save_result: bool = typer.Option(False, "--save-result", help="Write result files."),
    save_detailed: bool = typer.Option(False, "--save-detailed"),
    result_dir: str | None = typer.Option(None, "--result-dir"),
    result_filename: str | None = typer.Option(None, "--result-filename"),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="PNG plots with results."),
    no_preflight: bool = typer.Option(
        False, "--no-preflight", help="Send even if the workload exceeds max_model_len."
    ),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar (CI)."),
    disable_tqdm: bool = typer.Option(False, "--disable-tqdm", help="Same as --no-progress."),
    sweep: str | None = typer.Option(None, "--sweep", help="concurrency | rate: find knee."),
    sweep_values: str | None = typer.Option(None, "--sweep-values", help="e.g. 1,2,4,8."),
    sweep_max_steps: int | None = typer.Option(None, "--sweep-max-steps"),
    sweep_min_gain: float | None = typer.Option(None, "--sweep-min-gain"),
) -> None:
    """Load-test an OpenAI-compatible server; `pdserve bench compare A.json B.json` compares."""
    if ctx.invoked_subcommand is not None:
        return
    from loadtest.command import OutputOptions, execute
    from loadtest.flags import BenchFlags

    if backend not in _BACKEND_ENDPOINTS:
        fail(f"unknown --backend {backend!r}; choose one of: {', '.join(_BACKEND_ENDPOINTS)}")
    flags = BenchFlags(
        workload=workload,
        label=label,
        base_url=base_url,
        host=host,
        port=port,
        endpoint=endpoint or (_BACKEND_ENDPOINTS[backend] if backend != "openai" else None),
        model=model,
        tokenizer=tokenizer,
        ignore_eos=ignore_eos,
        temperature=temperature,
        request_timeout_s=request_timeout_s,
        dataset_name=dataset_name,
        dataset_path=dataset_path,
        random_input_len=random_input_len,
        random_output_len=random_output_len,
        random_range_ratio=random_range_ratio,
        random_prefix_len=random_prefix_len,
        num_prompts=num_prompts,
        seed=seed,
        request_rate=request_rate,
        burstiness=burstiness,
        max_concurrency=max_concurrency,
        duration_s=duration_s,
        ramp_up_strategy=ramp_up_strategy,
        ramp_up_start_rps=ramp_up_start_rps,
        ramp_up_end_rps=ramp_up_end_rps,
        goodput=list(goodput),
        sweep=sweep,
        sweep_values=sweep_values,
        sweep_max_steps=sweep_max_steps,
        sweep_min_gain=sweep_min_gain,
    )
    out = OutputOptions(
        save_result=save_result or save_detailed,
        save_detailed=save_detailed,
        result_dir=result_dir,
        result_filename=result_filename,
        plots=plots,
        progress=not (no_progress or disable_tqdm),
        percentile_metrics=percentile_metrics,
        metric_percentiles=metric_percentiles,
        api_key=api_key,
        preflight=not no_preflight,
    )
    try:
        code = execute(flags, out)
    except PdserveError as e:
        fail(e.message)
        return
    if code:
        raise typer.Exit(code)


@bench_app.command("compare")
def compare(
    a: Path = typer.Argument(..., help="Baseline result JSON (pdserve or vLLM bench)."),
    b: Path = typer.Argument(..., help="Result JSON to compare against the baseline."),
) -> None:
    """Print two benchmark results side by side."""
    from loadtest.compare import compare_results, load_result
    from loadtest.terminal_view import compare_table

    try:
        rows = compare_results(load_result(a), load_result(b))
    except PdserveError as e:
        fail(e.message)
        return
    Console().print(compare_table(rows, a.name, b.name))
