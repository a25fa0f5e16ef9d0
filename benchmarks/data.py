"""Input pipeline benchmark: reader rows/s per worker, synthetic rows/s and Criteo converter MB/s.

    python -m benchmarks.data [--rows 2000000] [--worker_batch 8192] [--workers 1] [--pin_cpu 0]
    python -m benchmarks.data --reader_json --pin_cpu 0     # the reader alone, one JSON line

Writes Criteo-shaped synthetic Parquet and a Criteo TSV made from it into a
temporary directory, then times (1) the generator, (2) the reader as
``tf.data`` batches and as numpy batches, for ``--workers`` shares read one
after another (each is one worker's share; the median of ``--repeats`` runs
each, then mean +- spread over shares), and (3) the converter in hashing
and vocabulary mode (mean +- spread over ``--repeats`` runs).

The reader's ``tf.data`` figure counts rows inside the graph
(``Dataset.reduce``), as a training step's ``get_next`` consumes them; the
``eager`` figure adds a Python loop's cost per batch. Each timed run builds
its own dataset. In Python, :func:`reader_rows_per_core` measures in this
process and :func:`measure_pinned` in a child process pinned to one core.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from datasets import schema
from datasets.criteo import convert
from datasets.synthetic import generate, generate_table, write_criteo_tsv
from collective.cli import add_flag

logger = logging.getLogger("benchmarks.data")


def _timed(fn: Callable[[], float], repeats: int) -> List[float]:
    """Calls ``fn`` (which returns a work amount) ``repeats`` times; amounts per second."""
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        amount = fn()
        rates.append(amount / (time.perf_counter() - start))
    return rates


def _fmt(rates: Sequence[float], unit: str) -> str:
    spread = statistics.pstdev(rates) if len(rates) > 1 else 0.0
    return f"{statistics.mean(rates):>14,.0f} +- {spread:,.0f} {unit}"


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_reader_data(directory: str, rows: int) -> str:
    """Writes ``rows`` Criteo-shaped rows (40 columns) as 4 Parquet files in ``directory``; returns it."""
    generate(directory, rows, files=4, seed=1, progress=False)
    return directory


def _reader_runs(data: str, worker_batch: int, rank: int, world_size: int) -> Dict[str, Callable[[], int]]:
    """One function per reader path, each reading this share once and returning the rows it read."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    import collective.data as cd  # pylint: disable=import-outside-toplevel

    def dataset():
        return cd.parquet_dataset(data, worker_batch, label=schema.LABEL, rank=rank, world_size=world_size)

    def tf_data() -> int:
        return int(dataset().reduce(tf.constant(0, tf.int64),
                                    lambda n, element: n + tf.shape(element[1], out_type=tf.int64)[0]))

    def tf_data_eager() -> int:
        return sum(int(labels.shape[0]) for _, labels in dataset())

    def numpy() -> int:
        pieces, _ = cd.plan(data, rank=rank, world_size=world_size)
        return sum(len(b[schema.LABEL]) for b in cd.iterate_batches(pieces, list(schema.COLUMNS), worker_batch))

    return {"tf_data": tf_data, "tf_data_eager": tf_data_eager, "numpy": numpy}


def measure_reader(data: str, worker_batch: int, repeats: int, *, rank: int = 0,
                   world_size: int = 1) -> Dict[str, Any]:
    """Rows/s of each reader path over this share of ``data``, in this process (see :func:`reader_rows_per_core`).

    One untimed pass of each path first (page cache, TensorFlow's first
    dataset); then ``repeats`` rounds that time the paths one after another.
    """
    runs = _reader_runs(data, worker_batch, rank, world_size)
    expected = {name: run() for name, run in runs.items()}
    if len(set(expected.values())) != 1:
        raise RuntimeError(f"the reader paths read different row counts: {expected}")
    load_before = os.getloadavg()[0]
    wall: List[Dict[str, float]] = []
    cpu: Dict[str, List[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        wall.append({})
        for name, run in runs.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            rows = run()
            wall[-1][name] = rows / (time.perf_counter() - start)
            cpu[name].append(rows / max(time.process_time() - start_cpu, 1e-9))
    return {
        **{f"{name}_rows_per_s": statistics.median(r[name] for r in wall) for name in runs},
        "cpu_rows_per_s": {name: statistics.median(rates) for name, rates in cpu.items()},
        "repeats": wall, "rows": expected["numpy"], "batch": worker_batch, "columns": len(schema.COLUMNS),
        "cpus": sorted(os.sched_getaffinity(0)), "load_average": [load_before, os.getloadavg()[0]],
    }


def reader_rows_per_core(rows: int = 2_000_000, worker_batch: int = 8192, repeats: int = 3) -> Dict[str, Any]:
    """The Parquet reader's rows/s on ``rows`` Criteo-shaped rows at ``worker_batch``, measured in this process.

    Returns ``tf_data_rows_per_s`` (a ``tf.data`` pipeline, rows counted in
    the graph), ``tf_data_eager_rows_per_s`` (the same, iterated by a Python
    loop) and ``numpy_rows_per_s`` (numpy batches, no TensorFlow): medians
    of ``repeats`` wall-clock rates, one dict of rates per repeat in
    ``repeats``; ``cpu_rows_per_s``: the medians per second of this
    process's CPU time (less sensitive to other load on a shared core);
    ``rows``, ``batch``, ``columns``, the ``cpus`` it may run on and the
    1-minute load average before and after. Rows/s per core when this
    process is pinned to one core (:func:`measure_pinned`).
    """
    with tempfile.TemporaryDirectory(prefix="reader-bench-") as tmp:
        return measure_reader(write_reader_data(tmp, rows), worker_batch, repeats)


def measure_pinned(rows: int = 2_000_000, worker_batch: int = 8192, repeats: int = 3,
                   cpu: Optional[int] = None) -> Dict[str, Any]:
    """:func:`reader_rows_per_core` in a child process pinned to CPU ``cpu`` (default: the first this one may use)."""
    cpu = min(os.sched_getaffinity(0)) if cpu is None else cpu
    cmd = [sys.executable, "-m", "benchmarks.data", "--reader_json", "--pin_cpu", str(cpu), "--rows", str(rows),
           "--worker_batch", str(worker_batch), "--repeats", str(repeats)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed with exit code {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000, help="synthetic rows (default 2,000,000)")
    add_flag(parser, "--worker_batch", type=int, default=8192, help="rows per batch each share's reader yields (default 8192)")
    parser.add_argument("--batch-size", dest="worker_batch", type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help="shares to read, one after another (default 1)")
    add_flag(parser, "--tsv_rows", type=int, default=200_000, help="rows of the converter's TSV (default 200,000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement (default 3)")
    add_flag(parser, "--pin_cpu", type=int, default=None,
             help="run on this CPU only (os.sched_setaffinity), for rows/s per core")
    add_flag(parser, "--reader_json", action="store_true",
             help="measure the reader alone (one share) and print its figures as one JSON line")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.pin_cpu is not None:
        os.sched_setaffinity(0, {args.pin_cpu})  # before TensorFlow sizes its thread pools
    if args.reader_json:
        print(json.dumps(reader_rows_per_core(args.rows, args.worker_batch, args.repeats)))
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "synthetic")
        rates = _timed(lambda: generate_table(args.rows // 4, seed=1).num_rows, args.repeats)
        print(f"synthetic generate (in memory)   {_fmt(rates, 'rows/s')}")
        rates = _timed(lambda: write_reader_data(data, args.rows) and args.rows, 1)
        print(f"synthetic generate + write       {_fmt(rates, 'rows/s')}")
        nbytes = sum(os.path.getsize(os.path.join(data, f)) for f in os.listdir(data))
        print(f"  {args.rows:,} rows, {nbytes / 1e6:.0f} MB of Parquet in 4 files")

        shares = [measure_reader(data, args.worker_batch, args.repeats, rank=r, world_size=args.workers)
                  for r in range(args.workers)]
        labels = {"tf_data": "reader tf.data ", "tf_data_eager": "  (Python loop)", "numpy": "reader numpy   "}
        for name, label in labels.items():
            rates = [share[name + "_rows_per_s"] for share in shares]
            cpu = statistics.median(share["cpu_rows_per_s"][name] for share in shares)
            print(f"{label} per worker ({args.workers}) {_fmt(rates, 'rows/s')}   ({cpu:,.0f} per CPU-second) "
                  f"batch {args.worker_batch}, {len(schema.COLUMNS)} columns")
        print(f"  medians of {args.repeats} runs on CPU(s) {shares[0]['cpus']}, load average "
              f"{shares[0]['load_average'][0]:.1f} -> {shares[-1]['load_average'][1]:.1f}")

        tsv = os.path.join(tmp, "day_0")
        size = write_criteo_tsv(generate_table(args.tsv_rows, seed=2), tsv)
        for mode, kwargs in (("hash", {"hash_buckets": 1 << 20}), ("vocabulary", {"min_count": 1})):
            rates = _timed(lambda: convert(tsv, os.path.join(tmp, "out-" + mode), progress=False, **kwargs)
                           and size / 1e6, args.repeats)
            print(f"converter ({mode:<10})          {_fmt(rates, 'MB/s')}   "
                  f"({args.tsv_rows:,} rows, {size / 1e6:.0f} MB TSV)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
