"""Input pipeline benchmark: reader rows/s per worker, synthetic rows/s and Criteo converter MB/s.

    python -m benchmarks.data [--rows 2000000] [--worker_batch 8192] [--workers 1]

Writes Criteo-shaped synthetic Parquet and a Criteo TSV made from it into a
temporary directory, then times (1) the generator, (2) the reader as
``tf.data`` batches and as numpy batches, for ``--workers`` shares read one
after another (each is one worker's share), and (3) the converter in hashing
and vocabulary mode. Prints mean +- spread over ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from typing import Callable, List, Optional, Sequence

import numpy as np

from datasets import schema
from datasets.criteo import convert
from datasets.synthetic import generate, generate_table
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


def write_tsv(table, path: str) -> int:
    """Writes ``table`` (Criteo schema) as a Criteo TSV with hex categoricals; returns its size in bytes."""
    cols = [table.column(schema.LABEL).to_numpy().astype(np.int64).astype(str)]
    for name in schema.DENSE:
        cols.append(np.round(np.expm1(table.column(name).to_numpy())).astype(np.int64).astype(str))
    for name in schema.CATEGORICAL:
        cols.append(np.char.mod("%08x", table.column(name).to_numpy() * 2654435761 % (1 << 32)))
    lines = cols[0]
    for col in cols[1:]:
        lines = np.char.add(np.char.add(lines, "\t"), col)
    with open(path, "w") as f:
        f.write("\n".join(lines.tolist()) + "\n")
    return os.path.getsize(path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000, help="synthetic rows (default 2,000,000)")
    add_flag(parser, "--worker_batch", type=int, default=8192, help="rows per batch each share's reader yields (default 8192)")
    parser.add_argument("--batch-size", dest="worker_batch", type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help="shares to read, one after another (default 1)")
    add_flag(parser, "--tsv_rows", type=int, default=200_000, help="rows of the converter's TSV (default 200,000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement (default 3)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    import collective.data as cd  # imports TensorFlow: after argparse, so --help is fast

    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "synthetic")
        rates = _timed(lambda: generate_table(args.rows // 4, seed=1).num_rows, args.repeats)
        print(f"synthetic generate (in memory)   {_fmt(rates, 'rows/s')}")
        rates = _timed(lambda: len(generate(data, args.rows, files=4, seed=1)) and args.rows, 1)
        print(f"synthetic generate + write       {_fmt(rates, 'rows/s')}")
        nbytes = sum(os.path.getsize(os.path.join(data, f)) for f in os.listdir(data))
        print(f"  {args.rows:,} rows, {nbytes / 1e6:.0f} MB of Parquet in 4 files")

        def read_tf(rank: int) -> Callable[[], float]:
            def run() -> float:
                ds = cd.parquet_dataset(data, args.worker_batch, label=schema.LABEL, rank=rank,
                                        world_size=args.workers, drop_remainder=True)
                return float(sum(int(labels.shape[0]) for _, labels in ds))
            return run

        def read_np(rank: int) -> Callable[[], float]:
            def run() -> float:
                pieces, _ = cd.plan(data, rank=rank, world_size=args.workers)
                return float(sum(len(b[schema.LABEL]) for b in
                                 cd.iterate_batches(pieces, list(schema.COLUMNS), args.worker_batch)))
            return run

        for name, reader in (("reader tf.data", read_tf), ("reader numpy  ", read_np)):
            per_worker = [statistics.mean(_timed(reader(r), args.repeats)) for r in range(args.workers)]
            print(f"{name} per worker ({args.workers})  {_fmt(per_worker, 'rows/s')}   "
                  f"batch {args.worker_batch}, 40 columns")

        tsv = os.path.join(tmp, "day_0")
        size = write_tsv(generate_table(args.tsv_rows, seed=2), tsv)
        for mode, kwargs in (("hash", {"hash_buckets": 1 << 20}), ("vocabulary", {"min_count": 1})):
            rates = _timed(lambda: convert(tsv, os.path.join(tmp, "out-" + mode), progress=False, **kwargs)
                           and size / 1e6, args.repeats)
            print(f"converter ({mode:<10})          {_fmt(rates, 'MB/s')}   "
                  f"({args.tsv_rows:,} rows, {size / 1e6:.0f} MB TSV)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
