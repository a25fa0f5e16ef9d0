"""python -m datasets.synthetic --out DIR --rows N: writes Criteo-shaped synthetic Parquet."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Optional, Sequence

from collective.cli import add_flag
from datasets.synthetic import generate


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m datasets.synthetic", description=__doc__)
    parser.add_argument("--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in all (default 1,000,000)")
    parser.add_argument("--files", type=int, default=1, help="number of Parquet files (default 1)")
    parser.add_argument("--scale", type=float, default=0.01,
                        help="table sizes as a fraction of Criteo Kaggle's (default 0.01)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the rows (default 0)")
    add_flag(parser, "--teacher_seed", type=int, default=0,
             help="seed of the labelling model; keep it equal for train and test (default 0)")
    parser.add_argument("--zipf", type=float, default=1.1, help="power-law exponent of id frequencies (default 1.1)")
    add_flag(parser, "--row_group_size", type=int, default=65536, help="rows per row group (default 65536)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    start = time.perf_counter()
    paths = generate(args.out, args.rows, files=args.files, scale=args.scale, seed=args.seed, zipf=args.zipf,
                     teacher_seed=args.teacher_seed, row_group_size=args.row_group_size, progress=not args.quiet)
    seconds = time.perf_counter() - start
    print(f"wrote {args.rows} rows to {len(paths)} file(s) in {args.out} "
          f"({seconds:.2f} s, {args.rows / max(seconds, 1e-9):,.0f} rows/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
