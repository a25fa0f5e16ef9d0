"""python -m datasets.criteo IN.tsv[.gz] ... --out DIR: Criteo TSV -> the model zoo's data layout.

DIR/train/ and DIR/test/ (Parquet: label, I1-I13, C1-C26), DIR/meta.json (the table sizes) and, with a
frequency threshold, DIR/vocabulary.arrow; train with `modelzoo/dlrm/train.py --data DIR`. The test split is
--test FILE..., else the last day when every input is a Terabyte day file (day_0 ... day_23: day_23), else the
last --test_fraction of the rows (Kaggle's train.txt).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from typing import List, Optional, Sequence, Tuple

from collective.cli import add_flag
from datasets.criteo import convert_dataset

DAY_FILE = re.compile(r"^day_(\d+)(\.gz)?$")


def split_inputs(inputs: Sequence[str], test: Sequence[str], test_fraction: Optional[float]
                 ) -> Tuple[List[str], List[str], float]:
    """``(train files, test files, test fraction)`` as the command line's rules say (see the module doc)."""
    if test:
        if test_fraction:
            raise SystemExit("give the test split as --test or as --test_fraction, not both")
        return list(inputs), list(test), 0.0
    days = [DAY_FILE.match(os.path.basename(path)) for path in inputs]
    if test_fraction is None and len(inputs) > 1 and all(days):
        last = max(range(len(inputs)), key=lambda i: int(days[i].group(1)))
        return [p for i, p in enumerate(inputs) if i != last], [inputs[last]], 0.0
    return list(inputs), [], 0.1 if test_fraction is None else test_fraction


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m datasets.criteo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", help="Criteo TSV files (train.txt, day_0, ...; .gz allowed)")
    parser.add_argument("--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--test", nargs="+", default=[], metavar="FILE",
                        help="TSV files of the test split (default: the last day of day_N inputs)")
    add_flag(parser, "--test_fraction", type=float, default=None,
             help="the last fraction of the rows that is the test split (default 0.1 unless the inputs "
             "are day files)")
    ids = parser.add_mutually_exclusive_group()
    add_flag(ids, "--min_count", type=int, default=1,
             help="keep categorical values seen at least this often, others get id 0 (default 1)")
    add_flag(ids, "--hash_buckets", type=int, help="hash categorical values into this many ids instead (one pass)")
    ids.add_argument("--vocabulary", help="use the vocabulary.arrow of an earlier conversion (e.g. the training days')")
    add_flag(parser, "--no_log", action="store_true", help="keep numbers as they are (negatives still clipped)")
    add_flag(parser, "--rows_per_file", type=int, default=1 << 22, help="rows per output file (default 4194304)")
    add_flag(parser, "--row_group_size", type=int, default=1 << 17, help="rows per row group (default 131072)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    train, test, fraction = split_inputs(args.inputs, args.test, args.test_fraction)
    summary = convert_dataset(train, args.out, test_inputs=test, test_fraction=fraction, min_count=args.min_count,
                              hash_buckets=args.hash_buckets, vocabulary=args.vocabulary,
                              log_transform=not args.no_log, rows_per_file=args.rows_per_file,
                              row_group_size=args.row_group_size, progress=not args.quiet)
    print(summary)
    split = f"the last {fraction:g} of the rows" if fraction else ", ".join(test) if test else "no rows"
    print(f"test split: {split}; train with --data {args.out}")
    if summary.rows_rejected:
        print(f"{summary.rows_rejected} rejected row(s); the first {len(summary.rejected)}:")
        for row in summary.rejected:
            print(f"  {row.path}:{row.line}: {row.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
