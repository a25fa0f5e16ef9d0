"""The export form of a hash-table vocabulary: a ``tf.lookup`` key -> row table and a ``[rows, dim]`` variable.

An exported SavedModel serves it with TensorFlow ops only, without this
package or Horovod; keys it does not hold read a zero vector, as
inference lookups do in training. Nothing in the graph depends on the
number of rows (the variable's static shape is ``[None, dim]`` and the zero
vector is row 0 of :meth:`ExportedTable.padded`), so a serving update
(:mod:`collective.integration.serving_update`) can append the rows of new
keys to the variables of a version without a new graph.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from collective.embedding import modes
from collective.embedding.hash_table import local_variables
from collective.sharding import shards


class ExportedTable:
    """The plain form of a hash table in an export graph: key -> row ``tf.lookup`` table + ``[rows, dim]`` values.

    Keys the lookup table does not hold read a zero vector (row 0 of
    :meth:`padded`; a key held at row ``r`` is row ``r + 1`` there). It is
    the ``hash_index`` of the export variable's one-worker ``ShardInfo``, so
    the exchange (and, inside ``scope()``,
    ``tf.nn.embedding_lookup``) serve the export variable through
    :meth:`owned_vectors` with TensorFlow ops only.
    """

    def __init__(self, name: str, values: Optional[tf.Variable], index, rows: int, default_row=None):
        self.name, self.values, self.index, self.rows = name, values, index, rows
        self.default_row = default_row  # what keys not held read (the policy's default_value); None: zeros
        self.capacity = rows

    def owned_vectors(self, values: tf.Variable, keys: tf.Tensor, training: Optional[bool] = None) -> tf.Tensor:
        """:meth:`HashTable.owned_vectors` of the export form: never inserts."""
        del values, training
        return self.lookup(tf.reshape(keys, [-1]))

    def rows_of(self, keys: tf.Tensor) -> tf.Tensor:
        """Row of each key in :meth:`padded` (row 0, the default row, for keys not held: the index answers -1)."""
        return self.index.lookup(tf.cast(keys, tf.int64)) + 1

    def padded(self) -> tf.Tensor:
        """The values with the default row put first: zeros, or the table's policy's ``default_value``."""
        if self.default_row is None:
            default = tf.zeros([1, self.values.shape[1]], self.values.dtype)
        else:
            default = tf.constant([self.default_row], self.values.dtype)
        return tf.concat([default, self.values], axis=0)

    def lookup(self, keys: tf.Tensor) -> tf.Tensor:
        """Vectors of ``keys`` (any shape), the default row for keys not held."""
        return tf.gather(self.padded(), self.rows_of(keys))


def exported(var) -> Optional[ExportedTable]:
    """The :class:`ExportedTable` of an export-mode hash-table variable, else None."""
    return getattr(var, "_collective_exported_hash_table", None)


def export_index(name: str, full_name: str) -> tf.lookup.experimental.MutableHashTable:
    """The key -> row lookup table of table ``full_name``, registered in ``modes.EXPORT_HASH_INDEXES`` once."""
    for registered, index in tf.compat.v1.get_collection(modes.EXPORT_HASH_INDEXES):
        if registered == full_name:
            return index
    # At the root name scope, so that the op name equals the table's name: a TF1 SavedModel refers to
    # a MutableHashTable's saveable by the unscoped name and fails to load otherwise.
    with tf.compat.v1.get_default_graph().name_scope(None):
        index = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=-1,
                                                        name=f"{local_variables.op_name(full_name)}_hash_index")
    tf.compat.v1.add_to_collection(modes.EXPORT_HASH_INDEXES, (full_name, index))
    return index


def export_variable(name: str, dim: int, dtype=tf.float32, default_row=None) -> tf.Variable:
    """The export form of hash table ``name``: a variable named as the table, ``[rows, dim]`` at first.

    ``rows`` comes from the checkpoint (:func:`collective.embedding.modes.export_rows`);
    the static shape is ``[None, dim]``, so a restore may give it more rows. Keys not held
    read ``default_row`` (``dim`` numbers; None: zeros).
    """
    table_name = local_variables.full_name(name)
    rows = modes.export_rows(table_name)
    dtype = tf.as_dtype(dtype)
    values = local_variables.plain_variable(name, [None, int(dim)], dtype, lambda: tf.zeros([rows, int(dim)], dtype),
                                            [tf.compat.v1.GraphKeys.GLOBAL_VARIABLES])
    table = ExportedTable(table_name, values, export_index(name, table_name), rows, default_row)
    values._collective_exported_hash_table = table  # pylint: disable=protected-access
    # A one-worker ShardInfo (not in the sharded-table collection): lookups route to ``table``.
    values._collective_shard = shards.export_shard(values.op.name, rows, int(dim), table)  # pylint: disable=protected-access
    return values
