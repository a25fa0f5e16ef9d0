"""Parquet -> ``tf.data`` input pipelines, each worker reading its own share.

Public API:
  parquet_dataset(filenames, batch_size, fields=None, label=None, *, rank, world_size, shard_by,
                  shuffle_buffer, seed, num_epochs, drop_remainder, prefetch, list_format)
  ParquetDataset(filenames, batch_size, fields=None, ...), make_iterator(ds)   (HybridBackend names)
  count_rows(filenames, ...), shard_of(filenames, ...), plan(filenames, fields, ...)
  iterate_batches(pieces, columns, batch_size, ...)   numpy batches without TensorFlow
  DataError: bad files, columns or schemas; the message names them.
"""

from collective.data.batches import iterate_batches
from collective.data.files import DataError, expand_filenames
from collective.data.hybridbackend import ParquetDataset, make_iterator
from collective.data.reader import count_rows, parquet_dataset, plan, shard_of
from collective.data.sharding import Piece, shard_pieces

__all__ = ["DataError", "ParquetDataset", "Piece", "count_rows", "expand_filenames", "iterate_batches",
           "make_iterator", "parquet_dataset", "plan", "shard_of", "shard_pieces"]
