"""Our gRPC KV pull against a raw TCP socket, between two processes on this machine.

An exporter process holds ``--mib`` MiB of KV blocks in the built-in tiny-llama layout and
serves them two ways: a raw TCP socket that ``sendall``s the whole buffer, and a
``KVExportServer``. An importer process receives the same bytes

- over the socket with ``recv_into`` 1 MiB reads into a preallocated buffer, and
- with ``KVImportClient.pull`` into preallocated destination blocks (checksummed, verified)
  three ways: over gRPC on one stream, over gRPC on several (``transfer.num_streams`` as by
  default, at least two), and on the same-node path (the exporter's blocks live in shared
  memory; the stream carries locations and checksums, the importer copies),

alternating them ``--repeats`` times after a warm-up (``--compare-crc32`` adds a run per round: a
client that offers only the v1 CRC-32 checksum). Each round also times ``--prompt-pulls`` pulls of
the KV of a 4096-token prompt of tiny-llama (8 MiB) from handle to DONE on the warm channel.
Reported: medians over rounds (the machine is shared and noisy), with ``ratio`` the median of each
round's socket time over its gRPC pull time as configured by default (target >= 0.45) and the best
runs alongside; ``parallel_over_single_stream`` (target >= 1.3) and ``same_node_over_grpc`` (target
>= 3), medians of per-round ratios; the CPU seconds per MiB that each side spent (a measure that
load on other cores does not inflate); the prompt pull's median and best (target < 10 ms); the
1-minute load average. Both processes start with ``transfer.process_env.MALLOC_ENV`` (what the
deployments set) unless ``--no-malloc-env``. Prints one JSON line.

Usage: ``python benchmarks/transfer_vs_socket.py [--mib 256] [--repeats 5] [--compare-crc32]``
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing as mp
import os
import resource
import socket
import statistics
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from core.codec import from_plain, to_plain
from core.config import TransferConfig
from core.kv_handle import KVHandle, TransferState
from core.kv_layout import KVLayout
from transfer import KVExportServer, KVImportClient, NumpyBlockStore
from transfer.checksums import ChecksumAlgorithm
from transfer.process_env import MALLOC_ENV
from transfer.streams import StreamPlan

MIB = 1024 * 1024
# builtin:tiny-llama: 4 layers, 2 KV heads, head_dim 32, fp32, 16-token blocks -> 32 KiB blocks.
LAYOUT = KVLayout("builtin:tiny-llama", "float32", 16, 4, 2, 32, 0)
PROMPT_TOKENS = 4096
HOST = "127.0.0.1"

Sample = tuple[float, float, float]  # wall s, importer CPU s, exporter CPU s


def make_config(chunk_bytes: int) -> TransferConfig:
    """Loopback config shared by both processes (the exporter picks the chunk size)."""
    return TransferConfig(
        bind_host=HOST, chunk_bytes=chunk_bytes, insecure_test_token="benchmark-only-token"
    )


def cpu_s() -> float:
    """User + system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def exporter_main(conn: Connection, num_blocks: int, chunk_bytes: int) -> None:
    """Serve the blocks (in shared memory) over a raw socket and over gRPC until told to stop."""
    store = NumpyBlockStore(LAYOUT, num_blocks, shared=True)
    store.fill_random(seed=0)
    listener = socket.create_server((HOST, 0))
    with contextlib.closing(store), KVExportServer(store, make_config(chunk_bytes)) as server:
        conn.send(("ready", listener.getsockname()[1]))
        while True:
            command, arg = conn.recv()
            if command == "socket":
                peer, _ = listener.accept()
                with peer:
                    peer.sendall(store.data.reshape(-1).data)
                conn.send("sent")
            elif command == "export":
                conn.send(to_plain(server.export(list(range(arg)))))
            elif command == "cpu":
                conn.send(cpu_s())
            else:
                break
    listener.close()


def time_socket(conn: Connection, port: int, buffer: memoryview) -> None:
    """Receive ``len(buffer)`` bytes over a fresh TCP connection in 1 MiB reads."""
    with socket.create_connection((HOST, port)) as sock:
        conn.send(("socket", None))
        received = 0
        while received < len(buffer):
            n = sock.recv_into(buffer[received : received + MIB])
            if n == 0:
                raise ConnectionError("exporter closed the socket early")
            received += n
    conn.recv()


def time_pull(conn: Connection, client: KVImportClient, num_blocks: int) -> float:
    """Seconds from holding a fresh export's handle until its pull is DONE."""
    conn.send(("export", num_blocks))
    handle = from_plain(KVHandle, conn.recv())
    start = time.perf_counter()
    status = client.pull(handle, list(range(num_blocks))).wait(timeout_s=60)
    elapsed = time.perf_counter() - start
    if status.state is not TransferState.DONE:
        raise RuntimeError(f"pull failed: {status.reason} {status.message}")
    return elapsed


def measure(conn: Connection, run: Callable[[], object]) -> Sample:
    """Wall time of ``run()`` and the CPU both processes spent in it."""
    conn.send(("cpu", None))
    exporter_start_s = conn.recv()
    importer_start_s, start = cpu_s(), time.perf_counter()
    run()
    wall_s, importer_s = time.perf_counter() - start, cpu_s() - importer_start_s
    conn.send(("cpu", None))
    return wall_s, importer_s, conn.recv() - exporter_start_s


def importer_main(conn: Connection, result: Connection, args: argparse.Namespace) -> None:
    """Run the rounds against the exporter at the other end of ``conn``; send back samples."""
    _, port = conn.recv()
    num_blocks = args.mib * MIB // LAYOUT.block_bytes
    prompt_blocks = PROMPT_TOKENS // LAYOUT.block_size
    buffer = memoryview(bytearray(num_blocks * LAYOUT.block_bytes))
    store = NumpyBlockStore(LAYOUT, num_blocks)
    config = make_config(int(args.chunk_mib * MIB))
    wire = config.model_copy(update={"same_node": "off"})
    streams = parallel(config)
    clients = {
        "single_stream": KVImportClient(store, wire.model_copy(update={"num_streams": 1})),
        "parallel": KVImportClient(store, wire.model_copy(update={"num_streams": streams})),
        "same_node": KVImportClient(store, config),
    }
    if args.compare_crc32:
        clients["crc32"] = KVImportClient(
            store, config, accepted_checksums=(ChecksumAlgorithm.CRC32,)
        )
    samples: dict[str, list[Sample]] = {"socket": [], **{name: [] for name in clients}}
    prompt_s: list[float] = []
    try:
        time_socket(conn, port, buffer)  # warm-up: connections, page faults
        for client in clients.values():
            time_pull(conn, client, num_blocks)
        for _ in range(args.repeats):
            samples["socket"].append(measure(conn, lambda: time_socket(conn, port, buffer)))
            for name, client in clients.items():
                run = functools.partial(time_pull, conn, client, num_blocks)
                samples[name].append(measure(conn, run))
            default = clients[default_client(config)]
            prompt_s.extend(
                time_pull(conn, default, prompt_blocks) for _ in range(args.prompt_pulls)
            )
        if not np.array_equal(np.frombuffer(buffer, dtype=np.uint8), store.data.reshape(-1)):
            raise RuntimeError("socket and gRPC copies differ")
        paths = clients["same_node"].metrics.snapshot().pulls_by_path or {}
        if set(paths) != {"same_node"}:
            raise RuntimeError(f"the same-node client pulled over {paths}")
    finally:
        for client in clients.values():
            client.close()
        conn.send(("stop", None))
    result.send((samples, prompt_s))


def summarize(samples: list[Sample], socket: list[Sample], total_mib: float) -> dict[str, Any]:
    """Medians of one transport's rounds, paired with the socket rounds they alternated with."""
    wall = [s[0] for s in samples]
    ratios = [k[0] / s[0] for k, s in zip(socket, samples, strict=True)]
    return {
        "gbps": round(total_mib * MIB / statistics.median(wall) / 1e9, 3),
        "ratio": round(statistics.median(ratios), 3),
        "ratio_best": round(min(k[0] for k in socket) / min(wall), 3),
        "cpu_ms_per_mib": [
            round(statistics.median(s[side] for s in samples) * 1000 / total_mib, 3)
            for side in (1, 2)
        ],
    }


def parallel(config: TransferConfig) -> int:
    """The streams of the parallel client: the configured default, at least two."""
    return max(2, StreamPlan.from_config(config).max_streams)


def default_client(config: TransferConfig) -> str:
    """The client that pulls over gRPC as configured by default."""
    return "single_stream" if StreamPlan.from_config(config).max_streams == 1 else "parallel"


def speedup(fast: list[Sample], slow: list[Sample]) -> float:
    """Median over rounds of ``slow``'s wall time over ``fast``'s."""
    return round(statistics.median(s[0] / f[0] for f, s in zip(fast, slow, strict=True)), 3)


def report(
    args: argparse.Namespace, samples: dict[str, list[Sample]], prompt_s: list[float]
) -> str:
    """The JSON line."""
    num_blocks = args.mib * MIB // LAYOUT.block_bytes
    total_mib = num_blocks * LAYOUT.block_bytes / MIB
    socket_rounds = samples["socket"]
    config = make_config(MIB)
    grpc = samples[default_client(config)]
    ours = summarize(grpc, socket_rounds, total_mib)
    socket_cpu = summarize(socket_rounds, socket_rounds, total_mib)["cpu_ms_per_mib"]
    result: dict[str, Any] = {
        "benchmark": "transfer_vs_socket",
        "bytes": num_blocks * LAYOUT.block_bytes,
        "block_bytes": LAYOUT.block_bytes,
        "chunk_bytes": int(args.chunk_mib * MIB),
        "checksum": ChecksumAlgorithm.XXH3_64.name,
        "socket_gbps": summarize(socket_rounds, socket_rounds, total_mib)["gbps"],
        "grpc_gbps": ours["gbps"],
        "ratio": ours["ratio"],
        "ratio_best": ours["ratio_best"],
        "target_ratio": 0.45,
        "default_num_streams": StreamPlan.from_config(config).max_streams,
        "parallel_num_streams": parallel(config),
        "single_stream_gbps": summarize(samples["single_stream"], socket_rounds, total_mib)["gbps"],
        "parallel_gbps": summarize(samples["parallel"], socket_rounds, total_mib)["gbps"],
        "same_node_gbps": summarize(samples["same_node"], socket_rounds, total_mib)["gbps"],
        "parallel_over_single_stream": speedup(samples["parallel"], samples["single_stream"]),
        "target_parallel_over_single_stream": 1.3,
        "same_node_over_grpc": speedup(samples["same_node"], grpc),
        "target_same_node_over_grpc": 3.0,
        "cpu_ms_per_mib": {"socket": socket_cpu, "grpc": ours["cpu_ms_per_mib"]},
        "cpu_ratio": round(sum(socket_cpu) / sum(ours["cpu_ms_per_mib"]), 3),
        "prompt_tokens": PROMPT_TOKENS,
        "prompt_kv_bytes": PROMPT_TOKENS // LAYOUT.block_size * LAYOUT.block_bytes,
        "prompt_pull_ms": round(statistics.median(prompt_s) * 1000, 2),
        "prompt_pull_best_ms": round(min(prompt_s) * 1000, 2),
        "target_prompt_pull_ms": 10.0,
        "repeats": args.repeats,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
    }
    if "crc32" in samples:
        result["crc32"] = summarize(samples["crc32"], socket_rounds, total_mib)
    return json.dumps(result)


def main() -> None:
    """Start both processes, run the rounds and print one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="bytes moved per run, MiB")
    parser.add_argument("--repeats", type=int, default=5, help="rounds (one run of each)")
    parser.add_argument("--prompt-pulls", type=int, default=4, help="4K-prompt pulls per round")
    parser.add_argument(
        "--chunk-mib", type=float, default=TransferConfig().chunk_bytes / MIB, help="chunk size"
    )
    parser.add_argument("--compare-crc32", action="store_true", help="also time a v1 client")
    parser.add_argument(
        "--no-malloc-env", action="store_true", help="start both processes without MALLOC_ENV"
    )
    args = parser.parse_args()
    if not args.no_malloc_env:
        os.environ.update(MALLOC_ENV)  # inherited by the two spawned processes only
    num_blocks = args.mib * MIB // LAYOUT.block_bytes
    context = mp.get_context("spawn")
    to_exporter, exporter_end = context.Pipe()
    result, importer_result = context.Pipe()
    exporter = context.Process(
        target=exporter_main,
        args=(exporter_end, num_blocks, int(args.chunk_mib * MIB)),
        daemon=True,
    )
    importer = context.Process(
        target=importer_main, args=(to_exporter, importer_result, args), daemon=True
    )
    exporter.start()
    importer.start()
    for end in (to_exporter, exporter_end, importer_result):
        end.close()  # the children hold their own: a dead child now ends recv() with EOFError
    try:
        samples, prompt_s = result.recv()
    finally:
        importer.join(timeout=60)
        exporter.join(timeout=30)
    print(report(args, samples, prompt_s))


if __name__ == "__main__":
    main()
