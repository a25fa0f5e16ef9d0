"""Sharded tables: which rows a worker holds and how they are initialised.

A sharded table is one logical ``[vocab, dim]`` table; each worker holds the
rows its :class:`~collective.embedding.layout.ShardLayout` gives it as a
local variable, an ordinary resource variable tagged with a
:class:`ShardInfo`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from collective.embedding import key_init
from collective.embedding.layout import ShardLayout
from collective.sharding.layouts.column_wise import ColumnWiseLayout
from collective.sharding.layouts.table_wise import TableWiseLayout
from collective.tf_internals import patches

SHARDED_COLLECTION = "collective_sharded_tables"
# Tables up to this logical size are initialised whole on every worker, each
# keeping its rows: exactly the table one TensorFlow process would make, for
# any initialiser and any world size. Larger ones give each row a value that
# is a function of (row id, seed) (collective.embedding.key_init), so they
# too are the same logical table whatever the world size (one process
# included), without any worker holding the whole table.
WHOLE_TABLE_INIT_BYTES = 256 << 20

logger = logging.getLogger("collective.embedding")


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """Where a worker's shard sits in its logical table."""

    name: str
    vocab: int
    dim: int
    rank: int
    world_size: int
    # Set for hash-table vocabularies: the per-worker key -> local row index
    # (``collective.embedding.hash_table``). ``vocab`` is then the capacity
    # summed over workers and local rows are the index's capacity.
    hash_index: Any = None
    # Every worker holds the whole table (the ``replicated`` exchange).
    replicated: bool = False
    # The factor on the gradient lookups send back to these rows (see :func:`tag`).
    gradient_scale: float = 1.0
    # The rank holding the whole table (the ``table_wise`` placement), else None.
    holder: Optional[int] = None
    # Every rank holds a slice of every row's dims (the ``column_wise`` placement).
    column_wise: bool = False

    @property
    def placement(self) -> str:
        """``replicated``, ``table_wise``, ``column_wise`` or ``row_wise`` (see :mod:`collective.sharding.plan`)."""
        if self.holder is not None:
            return "table_wise"
        if self.column_wise:
            return "column_wise"
        return "replicated" if self.replicated else "row_wise"

    @property
    def layout(self):
        """This rank's :class:`ShardLayout` (or the table-wise or column-wise layout, which have the same methods)."""
        if self.holder is not None:
            return TableWiseLayout(self.rank, self.world_size, self.holder)
        if self.column_wise:
            return ColumnWiseLayout(self.rank, self.world_size, self.dim)
        return ShardLayout(self.rank, self.world_size, self.replicated)

    @property
    def columns(self):
        """``(lo, hi)``: the logical columns this rank holds (all of them but for a column-wise table)."""
        return self.layout.columns() if self.column_wise else (0, self.dim)

    @property
    def local_dim(self) -> int:
        """The width of this rank's local variable."""
        lo, hi = self.columns
        return hi - lo

    @property
    def local_rows(self) -> int:
        if self.hash_index is not None:
            return int(self.hash_index.capacity)
        return self.layout.rows_held(self.vocab)

    @property
    def logical_shape(self):
        return (self.vocab, self.dim)


def shard_of(var: Any) -> Optional[ShardInfo]:
    """The :class:`ShardInfo` of a sharded table's local variable, else None."""
    return getattr(var, "_collective_shard", None)


def scoped_contract(info: ShardInfo) -> ShardInfo:
    """``info`` with the loss contract of a table made inside ``CollectiveStrategy.scope()`` (see :func:`tag`)."""
    if info.world_size > 1 and info.gradient_scale == 1.0 and patches.active():
        return dataclasses.replace(info, gradient_scale=1.0 / info.world_size)
    return info


def tag(var: tf.Variable, info: ShardInfo) -> tf.Variable:
    """Marks ``var`` as the local shard described by ``info``.

    A table tagged inside ``CollectiveStrategy.scope()`` follows the
    strategy's loss contract: each worker's loss is a mean over its own
    ``B / N`` examples, so the gradients that the N workers' lookups send back
    to a row sum to N times one process's, and the exchange scales them by
    ``1 / N`` (``gradient_scale``). The table's gradient is then one process's
    the moment ``tf.gradients`` returns it, before any optimizer sees it.
    Tables of SOK's own API made outside the scope keep SOK's contract (a
    loss divided by the global batch size): scale 1.
    """
    info = scoped_contract(info)
    var._collective_shard = info  # pylint: disable=protected-access
    if not tf.executing_eagerly():
        tf.compat.v1.add_to_collection(SHARDED_COLLECTION, var)
    return var


def _constant_value(initializer: Any) -> Optional[np.ndarray]:
    value = getattr(initializer, "value", None)
    if value is None or callable(value):
        return None
    return np.asarray(value)


def _call_initializer(initializer: Callable, shape, dtype, full_shape, offset=(0, 0)) -> tf.Tensor:
    try:
        from collective.tf_internals import PartitionInfo as _PartitionInfo  # pylint: disable=import-outside-toplevel

        # TF1 variance-scaling initialisers take their scale from the full shape.
        return initializer(shape, dtype=dtype, partition_info=_PartitionInfo(list(full_shape), list(offset)))
    except TypeError:
        return initializer(shape, dtype=dtype)


def partition_sizes(rows: int, parts: int) -> list:
    """Rows of each of ``parts`` row partitions of a ``rows``-row variable, as ``get_variable`` slices them."""
    return [rows // parts + int(i < rows % parts) for i in range(parts)]


def partitioned_initializer(initializer: Callable, partitioner: Callable, shape, dtype: tf.DType) -> Callable:
    """``initializer`` as ``get_variable(..., partitioner=partitioner)`` applies it: once per row partition.

    Plain TensorFlow calls the initializer for each partition with the
    partition's shape, so a seeded random initializer starts every partition
    from the same stream: the logical table is the partitions' values one
    after another. Constant initializers, tables initialised row by row
    (over ``WHOLE_TABLE_INIT_BYTES``) and unpartitioned shapes keep ``initializer``.
    """
    vocab, dim = int(shape[0]), int(shape[1])
    dtype = tf.as_dtype(dtype)
    if _constant_value(initializer) is not None or vocab * dim * dtype.size > WHOLE_TABLE_INIT_BYTES:
        return initializer
    slices = [int(s) for s in partitioner(shape=tf.TensorShape([vocab, dim]), dtype=dtype)]
    if len(slices) != 2 or slices[1] != 1 or not 1 < slices[0] <= vocab:
        return initializer
    sizes = partition_sizes(vocab, slices[0])

    def per_partition(shape, dtype=dtype, partition_info=None):  # pylint: disable=unused-argument
        offsets = np.cumsum([0] + sizes[:-1])
        return tf.concat([_call_initializer(initializer, [size, dim], dtype, [vocab, dim], (int(offset), 0))
                          for size, offset in zip(sizes, offsets)], axis=0)

    return per_partition


def shard_initial_value(initializer: Callable, info: ShardInfo, dtype: tf.DType) -> tf.Tensor:
    """The initial value of ``info``'s shard: its layout's rows of the logical table."""
    dtype = tf.as_dtype(dtype)
    constant = _constant_value(initializer)
    if constant is not None:
        if constant.shape == tuple(info.logical_shape):
            return tf.constant(info.layout.local_part(constant), dtype=dtype)
        if constant.ndim == 0:
            return tf.fill([info.local_rows, info.local_dim], tf.constant(constant, dtype))
    if info.vocab * info.dim * dtype.size > WHOLE_TABLE_INIT_BYTES:
        try:
            by_row = key_init.KeyInitializer(initializer, info.name, info.dim, info.vocab, dtype)
        except TypeError:
            logger.warning("table %s (%d x %d) is initialised whole on every worker: its initializer %r cannot "
                           "give each row its own value", info.name, info.vocab, info.dim, initializer)
        else:
            rows = by_row(info.layout.global_row(tf.range(info.local_rows, dtype=tf.int64)))
            return info.layout.local_part(rows) if info.column_wise else rows
    whole = tf.convert_to_tensor(_call_initializer(initializer, [info.vocab, info.dim], dtype, info.logical_shape),
                                 dtype)
    return info.layout.local_part(whole)
