"""MovieLens ratings -> Parquet (``python -m datasets.movielens --help``).

Public API:
  convert(src, out_dir, *, fmt=None, split="random", test_fraction=0.2, seed=0, data_dir=None,
          row_group_size=None, progress=True) -> MovieLensSummary
  read(path, fmt=None, data_dir=None) -> Release;  read_100k, read_1m, read_csv, read_tfds, detect_format
  split_mask(ratings, user_id, how="random", test_fraction=0.2, seed=0) -> bool array (True = test)
"""

from datasets.movielens.convert import MovieLensSummary, convert, split_mask
from datasets.movielens.readers import (MovieLensError, Release, detect_format, read, read_100k, read_1m, read_csv,
                                        read_tfds)

__all__ = ["MovieLensError", "MovieLensSummary", "Release", "convert", "detect_format", "read", "read_100k",
           "read_1m", "read_csv", "read_tfds", "split_mask"]
