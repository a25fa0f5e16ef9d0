"""Criteo click logs -> Parquet (``python -m datasets.criteo --help``).

Public API:
  convert(inputs, out_dir, *, min_count=1, hash_buckets=None, vocabulary=None, log_transform=True,
          rows_per_file=4194304, row_group_size=131072, block_size=16777216, progress=True,
          max_reported=100) -> ConversionSummary
  Vocabulary.load(path), FrequencyCounter, hashed_ids(values, present, buckets)
"""

from datasets.criteo.convert import ConversionSummary, convert
from datasets.criteo.parse import Rejected, hex_values
from datasets.criteo.vocab import FrequencyCounter, Vocabulary, VocabularyError, hashed_ids

__all__ = ["ConversionSummary", "FrequencyCounter", "Rejected", "Vocabulary", "VocabularyError", "convert",
           "hashed_ids", "hex_values"]
