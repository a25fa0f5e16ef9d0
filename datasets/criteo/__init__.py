"""Criteo click logs -> Parquet (``python -m datasets.criteo --help``).

Public API:
  convert(inputs, out_dir, *, min_count=1, hash_buckets=None, vocabulary=None, log_transform=True,
          rows_per_file=4194304, row_group_size=131072, block_size=16777216, progress=True,
          max_reported=100) -> ConversionSummary                       (one split, flat)
  convert_dataset(inputs, out_dir, *, test_inputs=(), test_fraction=0.0, ...) -> ConversionSummary
                                                  (train/ + test/ + meta.json: the model zoo's --data)
  Vocabulary.load(path), FrequencyCounter, hashed_ids(values, present, buckets)
"""

from datasets.criteo.convert import ConversionSummary, convert, convert_dataset
from datasets.criteo.parse import Rejected, hex_values
from datasets.criteo.vocab import FrequencyCounter, Vocabulary, VocabularyError, hashed_ids

__all__ = ["ConversionSummary", "FrequencyCounter", "Rejected", "Vocabulary", "VocabularyError", "convert",
           "convert_dataset",
           "hashed_ids", "hex_values"]
