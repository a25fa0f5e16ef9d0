"""Microbenchmark of collective.kernels against the nearest library routines.

Run on a machine with a CUDA GPU and the ``gpu`` extra::

    python -m benchmarks.kernels                     # 1e4 .. 1e8 keys
    python -m benchmarks.kernels --max_keys 1e7 --json out.json

For each size it times (CUDA events, median of ``--repeats`` after a warm-up):
partition (ours vs a sort-based partition), unique (ours vs ``cupy.unique``
and ``torch.unique`` when torch is importable), hash-table insert and find,
and the segment combiner forward/backward. It prints keys/s and the fraction
of the device's peak memory bandwidth that the minimum traffic of each
operation (bytes it must read and write once) would need at that speed, and
writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, Callable, Dict, List, Optional
from collective.cli import add_flag

logger = logging.getLogger("benchmarks.kernels")

DEFAULT_SIZES = (10**4, 10**5, 10**6, 10**7, 10**8)


def peak_bandwidth(cp: Any) -> Optional[float]:
    """Peak device memory bandwidth in bytes/s from CuPy's device attributes, or None if unknown."""
    attributes = cp.cuda.Device().attributes
    clock_khz = attributes.get("MemoryClockRate")
    bus_bits = attributes.get("GlobalMemoryBusWidth")
    if not clock_khz or not bus_bits:
        return None
    return 2.0 * clock_khz * 1e3 * bus_bits / 8.0  # double data rate


def time_gpu(cp: Any, fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``fn`` on the current stream, after one warm-up call."""
    fn()
    cp.cuda.Stream.null.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    times.sort()
    return times[len(times) // 2]


def make_ids(cp: Any, n: int, distribution: str, seed: int) -> Any:
    """``n`` int64 ids: uniform over 2n values, or Zipf(1.2) like recommender traffic."""
    if distribution == "zipf":
        import numpy as np

        return cp.asarray(np.random.default_rng(seed).zipf(1.2, size=n).astype(np.int64))
    return cp.random.default_rng(seed).integers(0, 2 * n, size=n, dtype=cp.int64)


def _torch_unique(cp: Any, ids: Any) -> Optional[Callable[[], Any]]:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    tensor = torch.from_dlpack(ids)
    return lambda: torch.unique(tensor, sorted=False, return_inverse=True, return_counts=True)


def bench_size(cp: Any, ops: Any, n: int, args: argparse.Namespace) -> List[Dict[str, Any]]:
    """All benchmark rows for one size."""
    ids = make_ids(cp, n, args.distribution, args.seed)
    num_unique = int(ops.unique(ids)[0].shape[0])
    table = ops.HashTable(capacity=max(num_unique, 1), load_factor=args.load_factor)
    table.insert_or_find(ids)
    dim = args.dim
    rows_of_values = max(1, min(n, args.max_combine_rows))
    values = cp.random.default_rng(args.seed).standard_normal((rows_of_values, dim), dtype=cp.float32)
    segments = max(1, rows_of_values // 8)
    seg = cp.sort(cp.random.default_rng(args.seed + 1).integers(0, segments, size=rows_of_values, dtype=cp.int64))
    grad = cp.ones((segments, dim), dtype=cp.float32)

    def fresh_insert() -> Any:
        return ops.HashTable(capacity=max(num_unique, 1), load_factor=args.load_factor).insert_or_find(ids)

    # (name, implementation, callable, keys processed, minimum bytes moved)
    cases = [
        ("partition", "collective", lambda: ops.partition(ids, args.buckets), n, 24 * n),
        ("partition", "sort (cupy.argsort)", lambda: ops.partition_by_sort(ids, args.buckets), n, 24 * n),
        ("unique", "collective", lambda: ops.unique(ids), n, 16 * n + 16 * num_unique),
        ("unique", "cupy.unique", lambda: cp.unique(ids, return_inverse=True, return_counts=True), n,
         16 * n + 16 * num_unique),
        ("hash find", "collective", lambda: table.find(ids), n, 16 * n + 16 * num_unique),
        ("hash insert_or_find", "collective (new table)", fresh_insert, n, 16 * n + 16 * num_unique),
        ("segment_combine mean", "collective", lambda: ops.segment_combine(values, seg, segments, None, "mean"),
         rows_of_values, 4 * rows_of_values * dim + 8 * rows_of_values + 4 * segments * dim),
        ("segment_combine_grad mean", "collective", lambda: ops.segment_combine_grad(grad, seg, None, "mean"),
         rows_of_values, 4 * rows_of_values * dim + 8 * rows_of_values + 4 * segments * dim),
    ]
    torch_fn = _torch_unique(cp, ids)
    if torch_fn is not None:
        cases.insert(4, ("unique", "torch.unique", torch_fn, n, 16 * n + 16 * num_unique))
    peak = peak_bandwidth(cp)
    rows = []
    for op, impl, fn, keys, nbytes in cases:
        seconds = time_gpu(cp, fn, args.repeats)
        rows.append({
            "op": op, "impl": impl, "keys": keys, "seconds": seconds, "keys_per_s": keys / seconds,
            "min_bytes": nbytes, "bandwidth_fraction": (nbytes / seconds / peak) if peak else None,
        })
        logger.info("%s / %s / %d keys: %.3g s", op, impl, keys, seconds)
    return rows


def format_table(rows: List[Dict[str, Any]]) -> str:
    """Rows as a fixed-width text table."""
    header = f"{'op':<26} {'implementation':<24} {'keys':>10} {'ms':>10} {'keys/s':>10} {'of peak BW':>10}"
    lines = [header, "-" * len(header)]
    for row in rows:
        fraction = "n/a" if row["bandwidth_fraction"] is None else f"{100 * row['bandwidth_fraction']:.1f}%"
        lines.append(
            f"{row['op']:<26} {row['impl']:<24} {row['keys']:>10.0e} {1e3 * row['seconds']:>10.3f} "
            f"{row['keys_per_s']:>10.3g} {fraction:>10}"
        )
    return "\n".join(lines)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.kernels", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=None, help="key counts (default 1e4 .. 1e8)")
    add_flag(parser, "--max_keys", type=float, default=1e8, help="drop default sizes above this (default 1e8)")
    parser.add_argument("--buckets", type=int, default=8, help="partition buckets, i.e. workers (default 8)")
    parser.add_argument("--distribution", choices=("uniform", "zipf"), default="uniform", help="id distribution")
    add_flag(parser, "--load_factor", type=float, default=0.5, help="hash-table load factor (default 0.5)")
    parser.add_argument("--dim", type=int, default=64, help="embedding dimension for the combiners (default 64)")
    add_flag(parser, "--max_combine_rows", type=int, default=10**7, help="cap on combiner rows (default 1e7)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per case; the median is kept (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="kernels_benchmark.json", help="where to write the rows")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the benchmark; 0 on success, 2 where CuPy or a GPU is missing."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        import cupy as cp

        from collective.kernels import cupy_ops as ops
    except ImportError:
        print("benchmarks.kernels needs CuPy and a CUDA GPU: install the gpu extra (pip install 'collective[gpu]') "
              "on a GPU machine and run again.", file=sys.stderr)
        return 2
    from collective.kernels import kernels_available

    if not kernels_available():
        print("benchmarks.kernels: CuPy is installed but sees no CUDA device; run it on a GPU machine.", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes] if args.sizes else [s for s in DEFAULT_SIZES if s <= args.max_keys]
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    device = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    peak = peak_bandwidth(cp)
    print(f"device: {device}; peak memory bandwidth: {'unknown' if peak is None else f'{peak / 1e9:.0f} GB/s'}")
    rows: List[Dict[str, Any]] = []
    for n in sizes:
        try:
            rows.extend(bench_size(cp, ops, n, args))
        except cp.cuda.memory.OutOfMemoryError:
            logger.warning("out of GPU memory at %d keys; skipping this size and larger ones", n)
            break
        cp.get_default_memory_pool().free_all_blocks()
    print(format_table(rows))
    report = {"device": device, "peak_bandwidth_bytes_per_s": peak, "args": vars(args), "rows": rows}
    with open(args.json, "w") as handle:
        json.dump(report, handle, indent=2)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
