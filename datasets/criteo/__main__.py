"""python -m datasets.criteo IN.tsv[.gz] ... --out DIR: Criteo TSV -> Parquet (label, I1-I13, C1-C26)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional, Sequence

from datasets.criteo import convert


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m datasets.criteo", description=__doc__)
    parser.add_argument("inputs", nargs="+", help="Criteo TSV files (train.txt, day_0, ...; .gz allowed)")
    parser.add_argument("--out", required=True, help="output directory (created if missing)")
    ids = parser.add_mutually_exclusive_group()
    ids.add_argument("--min-count", type=int, default=1,
                     help="keep categorical values seen at least this often, others get id 0 (default 1)")
    ids.add_argument("--hash-buckets", type=int, help="hash categorical values into this many ids instead (one pass)")
    ids.add_argument("--vocabulary", help="use the vocabulary.arrow of an earlier conversion (e.g. the training days')")
    parser.add_argument("--no-log", action="store_true", help="keep numbers as they are (negatives still clipped)")
    parser.add_argument("--rows-per-file", type=int, default=1 << 22, help="rows per output file (default 4194304)")
    parser.add_argument("--row-group-size", type=int, default=1 << 17, help="rows per row group (default 131072)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    summary = convert(args.inputs, args.out, min_count=args.min_count, hash_buckets=args.hash_buckets,
                      vocabulary=args.vocabulary, log_transform=not args.no_log, rows_per_file=args.rows_per_file,
                      row_group_size=args.row_group_size, progress=not args.quiet)
    print(summary)
    if summary.rows_rejected:
        print(f"{summary.rows_rejected} rejected row(s); the first {len(summary.rejected)}:")
        for row in summary.rejected:
            print(f"  {row.path}:{row.line}: {row.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
