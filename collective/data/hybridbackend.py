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

from collective import comm
from collective.integration import sync
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


class SynchronisedIterator:
    """A one-shot iterator over a batched dataset whose input ends on every worker at the same step.

    After its last batch a worker gets batches with zero rows while others
    still have data (its lookups keep serving theirs); ``get_next()`` raises
    ``OutOfRangeError`` on every worker in the first step in which no worker
    has data left (:mod:`collective.integration.sync`), which ends
    ``MonitoredTrainingSession`` loops together.
    """

    def __init__(self, ds: tf.data.Dataset):
        spec = ds.element_spec
        self._has_labels = isinstance(spec, tuple) and len(spec) == 2
        self._iterator = tf.compat.v1.data.make_one_shot_iterator(sync.pad_with_empty_batches(ds))

    def get_next(self, name: Optional[str] = None):
        element = self._iterator.get_next(name=name)
        features, labels = element if self._has_labels else (element, None)
        step = sync.synchronise(features, labels)
        return (step.features, step.labels) if self._has_labels else step.features


def make_iterator(ds: tf.data.Dataset):
    """An iterator over ``ds``: a TF1 one-shot iterator in graph mode (``get_next()`` gives
    tensors, nothing to initialise under ``MonitoredTrainingSession``), a Python iterator eagerly.

    On several workers the graph-mode iterator is a :class:`SynchronisedIterator`, as HybridBackend's
    data sync: workers with unequal shares stop at the same step instead of leaving the others inside
    a collective.
    """
    if tf.executing_eagerly():
        return iter(ds)
    if comm.world_size() > 1:
        return SynchronisedIterator(ds)
    return tf.compat.v1.data.make_one_shot_iterator(ds)
