"""Parquet files as a ``tf.data.Dataset`` of batches, sharded by worker.

    ds = collective.data.parquet_dataset("train/", batch_size=8192, label="label",
                                         shuffle_buffer=65536, seed=1)
    features, labels = next(iter(ds))

Plain columns become dense tensors of shape ``[batch]``; list columns become
``tf.RaggedTensor`` (or ``tf.SparseTensor`` with ``list_format="sparse"``).
Integers are delivered as int64, float32 and float64 as they are stored.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Optional, Sequence, Union

import tensorflow as tf

from collective.data.batches import is_list, iterate_batches, numpy_dtype
from collective.data.files import DataError, FileSpec, check_same_schema, expand_filenames, read_info
from collective.data.sharding import Piece, resolve_rank, shard_pieces

logger = logging.getLogger("collective.data")

LIST_FORMATS = ("ragged", "sparse")


def _own_rank() -> Optional[int]:
    """This process's rank, None where the environment does not say (planning for other ranks is allowed)."""
    try:
        return resolve_rank(None, None)[0]
    except Exception:  # pylint: disable=broad-except
        return None


def plan(filenames: FileSpec, fields: Optional[Sequence[str]] = None, *, rank: Optional[int] = None,
         world_size: Optional[int] = None, shard_by: str = "auto"):
    """This worker's pieces and the checked schema of ``fields``: ``(pieces, schema)``.

    Raises :class:`DataError` naming a missing file or column, or the column
    whose type differs between two files.
    """
    own_rank = _own_rank() if rank is not None else None
    rank, world_size = resolve_rank(rank, world_size)
    infos = [read_info(path) for path in expand_filenames(filenames)]
    schema = check_same_schema(infos, list(fields) if fields is not None else None)
    pieces = shard_pieces(infos, rank, world_size, shard_by)
    # Each worker logs its own share; planning another rank's (to count its rows) is not news.
    logger.log(logging.INFO if own_rank in (None, rank) else logging.DEBUG,
               "worker %d/%d reads %d piece(s) of row groups, %d rows, of %d file(s)", rank, world_size,
               len(pieces), sum(p.num_rows for p in pieces), len(infos))
    return pieces, schema


def _tf_dtype(type_) -> tf.DType:
    dtype = numpy_dtype(type_)
    return tf.string if dtype == object else tf.as_dtype(dtype)


def parquet_dataset(filenames: FileSpec, batch_size: int, fields: Optional[Sequence[str]] = None,
                    label: Optional[Union[str, Sequence[str]]] = None, *, rank: Optional[int] = None,
                    world_size: Optional[int] = None, shard_by: str = "auto", shuffle_buffer: int = 0,
                    seed: Optional[int] = None, num_epochs: Optional[int] = 1, drop_remainder: bool = False,
                    prefetch: Optional[int] = tf.data.AUTOTUNE, list_format: str = "ragged") -> tf.data.Dataset:
    """Batches of the Parquet ``filenames`` that this worker reads.

    Args:
      filenames: a file, directory, glob pattern or a list of them.
      batch_size: rows per batch (per worker).
      fields: columns to read; all when None.
      label: column name(s) returned apart as labels: the dataset then yields
        ``(features, labels)``; otherwise one dict of every field.
      rank, world_size: this worker's share; default from ``collective.context``.
      shard_by: ``auto``, ``file``, ``row_group`` or ``rows`` (see :mod:`collective.data.sharding`).
      shuffle_buffer: rows shuffled together (0: keep file order); with ``seed``.
      num_epochs: passes over the data; None repeats forever.
      drop_remainder: drop a last batch shorter than ``batch_size`` (static batch shape).
      prefetch: batches to prepare ahead (None or 0: no prefetch).
      list_format: list columns as ``ragged`` or ``sparse`` tensors.
    """
    if list_format not in LIST_FORMATS:
        raise DataError(f"list_format={list_format!r} is not one of {', '.join(LIST_FORMATS)}")
    labels = [label] if isinstance(label, str) else list(label or [])
    if fields is not None:
        fields = list(fields) + [name for name in labels if name not in fields]
    pieces, schema = plan(filenames, fields, rank=rank, world_size=world_size, shard_by=shard_by)
    for name in labels:
        if schema.get_field_index(name) < 0:
            raise DataError(f"label column {name!r} not found; the files have: {', '.join(schema.names)}")
    listed = [f.name for f in schema if is_list(f.type)]
    batch_dim = batch_size if drop_remainder else None
    specs: Dict[str, object] = {}
    for f in schema:
        dtype = _tf_dtype(f.type)
        if f.name in listed:
            specs[f.name] = (tf.TensorSpec([None], dtype),
                             tf.TensorSpec([None if batch_dim is None else batch_dim + 1], tf.int64))
        else:
            specs[f.name] = tf.TensorSpec([batch_dim], dtype)
    single_label = isinstance(label, str)

    def nest_like_output(columns: Dict[str, object]):
        """``columns`` (one batch, by name) in the dataset's element structure."""
        if not labels:
            return columns
        features = {name: value for name, value in columns.items() if name not in labels}
        targets = tuple(columns[name] for name in labels)
        return features, targets[0] if single_label else targets

    def generate():
        for batch in iterate_batches(pieces, list(schema.names), batch_size, shuffle_buffer=shuffle_buffer,
                                     seed=seed, num_epochs=num_epochs, drop_remainder=drop_remainder):
            yield nest_like_output(batch)

    def assemble(*element):
        """(values, row_splits) pairs of list columns -> ragged or sparse tensors."""
        features, targets = element if labels else (element[0], None)
        columns = dict(features)
        if labels:
            columns.update(zip(labels, (targets,) if single_label else targets))
        for name in listed:
            ragged = tf.RaggedTensor.from_row_splits(*columns[name], validate=False)
            columns[name] = ragged.to_sparse() if list_format == "sparse" else ragged
        return nest_like_output(columns)

    # One element per batch, in its final structure, and a map only for list columns: from_generator
    # and a map cost per tensor and per element, the batches themselves are views (see batches.py).
    ds = tf.data.Dataset.from_generator(generate, output_signature=nest_like_output(specs))
    if listed:
        ds = ds.map(assemble, num_parallel_calls=None)
    if prefetch:
        ds = ds.prefetch(prefetch)
    return ds


def count_rows(filenames: FileSpec, *, rank: Optional[int] = None, world_size: Optional[int] = None,
               shard_by: str = "auto") -> int:
    """Rows this worker's share holds (from footers only), e.g. to size an epoch in steps."""
    pieces, _ = plan(filenames, [], rank=rank, world_size=world_size, shard_by=shard_by)
    return sum(p.num_rows for p in pieces)


def shard_of(filenames: FileSpec, *, rank: Optional[int] = None, world_size: Optional[int] = None,
             shard_by: str = "auto") -> List[Piece]:
    """The pieces this worker reads, in order: path, row group, and which of its rows."""
    return plan(filenames, [], rank=rank, world_size=world_size, shard_by=shard_by)[0]
