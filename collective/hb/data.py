"""``hb.data``: HybridBackend's dataset names over :mod:`collective.data`.

``ParquetDataset(filenames, batch_size=...)`` gives every worker its own
share of the files' row groups; ``make_iterator(ds)`` an iterator whose
``get_next()`` is a dict of tensors.
"""

from collective.data import DataError, ParquetDataset, make_iterator, parquet_dataset

__all__ = ["DataError", "ParquetDataset", "make_iterator", "parquet_dataset"]
