"""HybridBackend's data API names, over :func:`collective.data.parquet_dataset`.

    ds = ParquetDataset("/path/to/f1.parquet", batch_size=1024)
    ds = ds.prefetch(4)
    features = make_iterator(ds).get_next()   # {'a': tensor_a, 'c': tensor_c}

As in HybridBackend, every field (labels included) comes in one dict, and
each worker reads its own share (``partition_index`` of ``partition_count``,
by default this worker's rank and the world size).
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from collective.data.files import FileSpec
from collective.data.reader import parquet_dataset


def _field_name(field) -> str:
    return field if isinstance(field, str) else getattr(field, "name")


def ParquetDataset(filenames: FileSpec, batch_size: int = 1, fields: Optional[Sequence] = None,  # noqa: N802
                   partition_count: Optional[int] = None, partition_index: Optional[int] = None,
                   drop_remainder: bool = False, **kwargs) -> tf.data.Dataset:
    """A dataset of dicts of batches of ``fields`` (names or objects with ``.name``) of ``filenames``.

    ``kwargs`` go to :func:`collective.data.parquet_dataset` (``shuffle_buffer``,
    ``seed``, ``num_epochs``, ``list_format``, ...). HybridBackend's
    ``num_parallel_reads`` and ``num_sequential_reads`` are accepted and ignored.
    """
    kwargs.pop("num_parallel_reads", None)
    kwargs.pop("num_sequential_reads", None)
    names = None if fields is None else [_field_name(f) for f in fields]
    return parquet_dataset(filenames, batch_size, names, rank=partition_index, world_size=partition_count,
                           drop_remainder=drop_remainder, **kwargs)


def make_iterator(ds: tf.data.Dataset):
    """An iterator over ``ds``: a TF1 one-shot iterator in graph mode (``get_next()`` gives
    tensors, nothing to initialise under ``MonitoredTrainingSession``), a Python iterator eagerly."""
    if tf.executing_eagerly():
        return iter(ds)
    return tf.compat.v1.data.make_one_shot_iterator(ds)
