"""python -m datasets.movielens SRC --out DIR: MovieLens (100k, 1m, 20m/25m/latest, tfds) -> Parquet."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional, Sequence

from collective.cli import add_flag
from datasets.movielens import convert
from datasets.movielens.convert import SPLITS
from datasets.movielens.readers import FORMATS


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m datasets.movielens", description=__doc__)
    parser.add_argument("src", help="unpacked MovieLens directory (or, with --format tfds, a prepared tfds ratings "
                                    "dataset: movielens/<release>-ratings, e.g. movielens/latest-small-ratings)")
    parser.add_argument("--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--format", choices=FORMATS, help="default: detected from the files in SRC")
    parser.add_argument("--split", choices=SPLITS, default="random",
                        help="random (by --seed) or time (each user's latest ratings go to test); default random")
    add_flag(parser, "--test_fraction", type=float, default=0.2, help="share of ratings in test (default 0.2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random split (default 0)")
    add_flag(parser, "--data_dir", help="tensorflow_datasets data directory (with --format tfds)")
    add_flag(parser, "--row_group_size", type=int, default=None,
             help="rows per row group of train.parquet and test.parquet (default: pyarrow's)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    summary = convert(args.src, args.out, fmt=args.format, split=args.split, test_fraction=args.test_fraction,
                      seed=args.seed, data_dir=args.data_dir, row_group_size=args.row_group_size,
                      progress=not args.quiet)
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
