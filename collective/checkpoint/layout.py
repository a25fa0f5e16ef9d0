"""How a sharded table's rows move between its in-memory and on-disk layouts.

In memory each worker holds the rows its table's
:class:`~collective.embedding.layout.ShardLayout` gives it. On disk a table
is one ``[vocab, dim]`` tensor stored as ``N`` contiguous row blocks, block
``s`` written by worker ``s`` as a slice: rows
``[vocab * s // N, vocab * (s + 1) // N)``. Saving re-lays the rows with one
alltoall (each worker then holds only its block); restoring under ``M``
workers reads the stored blocks one at a time and keeps the rows its
layout under ``M`` holds, so no worker ever holds more than its own shard
plus one stored block. A column-wise table is stored the same way (its
block's slices joined along the dims on the writer); its restore reads
every row whole and keeps its columns, so a worker holds the whole
logical table while it restores.
"""

from __future__ import annotations

import functools
from typing import List

import numpy as np
import tensorflow as tf

from collective import comm
from collective.checkpoint import logical
from collective.embedding import traced
from collective.embedding.layout import ShardLayout, positions_in_block
from collective.embedding.table import ShardInfo
from collective.sharding.layouts.column_wise import column_bounds
from collective.tf_internals import io_ops


def block_bounds(rows: int, world_size: int) -> List[int]:
    """Row bounds of the ``world_size`` contiguous blocks of a ``rows``-row table."""
    return [rows * s // world_size for s in range(world_size + 1)]


def slice_spec(shape, start, length) -> tf.Tensor:
    """SaveV2/RestoreV2 spec of rows ``[start, start + length)`` of a ``shape`` tensor (scalars may be tensors)."""
    def text(value):
        return str(int(value)) if isinstance(value, (int, np.integer)) else tf.strings.as_string(
            tf.cast(value, tf.int64))

    rest = ":-" * (len(shape) - 1)
    pieces = [text(d) + " " if isinstance(d, (int, np.integer)) else tf.strings.join([text(d), " "])
              for d in shape]
    return tf.strings.join(pieces + [text(start), ",", text(length), rest])


def contiguous_block(local: tf.Tensor, info: ShardInfo) -> tf.Tensor:
    """This worker's contiguous on-disk block, gathered from every worker's rows.

    ``local`` is this worker's shard (``info.local_rows`` rows); the result is
    rows ``block_bounds(vocab, N)[rank:rank + 2]`` of the logical table. A
    replicated table slices its own copy. A sharded one needs one alltoall:
    the rows a worker holds are sorted by id, so they are already grouped by
    destination block.
    """
    n, r = info.world_size, info.rank
    local = tf.convert_to_tensor(local)
    if n == 1:
        return tf.identity(local)
    bounds = block_bounds(info.vocab, n)
    if info.column_wise:
        return _joined_block(local, info, bounds)
    if not info.layout.sharded:
        return local[bounds[r]:bounds[r + 1]]
    ids, _ = logical.held_rows(info)
    owner = tf.searchsorted(tf.constant(bounds[1:], tf.int64), ids, side="right", out_type=tf.int32)
    splits = tf.math.bincount(owner, minlength=n, maxlength=n, dtype=tf.int32)
    received, _ = comm.alltoall(local, splits)
    # Rows arrive grouped by sender (their owner), ascending within a sender.
    block_ids = tf.range(bounds[r], bounds[r + 1], dtype=tf.int64)
    arrival = tf.argsort(info.layout.owner(block_ids), stable=True)
    return tf.gather(received, tf.math.invert_permutation(arrival))


def _joined_block(local: tf.Tensor, info: ShardInfo, bounds: List[int]) -> tf.Tensor:
    """A column-wise table's contiguous block: every rank sends each block's rows of its columns to the block's
    writer (one alltoall, slices padded to the widest), which joins them along the dims."""
    n, r = info.world_size, info.rank
    columns = column_bounds(info.dim, n)
    widest = max(columns[s + 1] - columns[s] for s in range(n))
    splits = tf.constant([bounds[s + 1] - bounds[s] for s in range(n)], tf.int32)
    received, _ = comm.alltoall(tf.pad(local, [[0, 0], [0, widest - info.local_dim]]), splits)
    by_rank = tf.reshape(received, [n, bounds[r + 1] - bounds[r], widest])
    return tf.concat([by_rank[s, :, :columns[s + 1] - columns[s]] for s in range(n)], axis=1)


def held_columns(rows: tf.Tensor, info: ShardInfo) -> tf.Tensor:
    """The columns of whole logical ``rows`` that ``info``'s variable holds (all but for a column-wise table)."""
    if not info.column_wise:
        return rows
    lo, hi = info.columns
    return rows[:, lo:hi]


def restore_rows(prefix: tf.Tensor, key: str, row_splits: tf.Tensor, full_shape, dtype: tf.DType,
                 layout: ShardLayout) -> tf.Tensor:
    """The rows ``layout`` holds of the stored tensor ``key``, read one stored block at a time.

    ``row_splits`` (int64 ``[blocks + 1]``) are the bounds of the blocks as
    stored; ``full_shape`` the stored tensor's shape (its first entry may be
    a tensor). Reading whole stored slices means each is read exactly once.
    """
    full_shape = list(full_shape)
    if all(isinstance(d, (int, np.integer)) for d in full_shape):
        shape = tf.constant(full_shape, tf.int64)  # one op where a stack of casts is five
    else:
        shape = tf.stack([tf.cast(d, tf.int64) for d in full_shape])
    first, step = layout.stride()
    rows = _block_reader(tf.as_dtype(dtype), len(full_shape))(
        tf.convert_to_tensor(prefix, tf.string), tf.constant(key), tf.cast(row_splits, tf.int64), shape,
        tf.constant(first, tf.int64), tf.constant(step, tf.int64))
    rows.set_shape([None] + [d if isinstance(d, (int, np.integer)) else None for d in full_shape[1:]])
    return rows


@functools.lru_cache(maxsize=None)
def _block_reader(dtype: tf.DType, rank: int):
    """One function per dtype and rank that every table's restore calls: a graph holds one loop per kind of
    tensor instead of one per table (each loop costs a tenth of a second to build), traced once per process
    (:func:`collective.embedding.traced.once`)."""
    signature = [tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.string), tf.TensorSpec([None], tf.int64),
                 tf.TensorSpec([rank], tf.int64), tf.TensorSpec([], tf.int64), tf.TensorSpec([], tf.int64)]

    @tf.function(input_signature=signature, autograph=False)
    def read_held_rows(prefix, key, row_splits, shape, first, step):
        blocks = tf.size(row_splits) - 1
        dims = [shape[i] for i in range(rank)]

        def body(b, parts):
            lo, hi = row_splits[b], row_splits[b + 1]
            spec = slice_spec(dims, lo, hi - lo)
            values = io_ops.restore_v2(prefix, tf.reshape(key, [1]), tf.reshape(spec, [1]), [dtype])[0]
            return b + 1, parts.write(b, tf.gather(values, positions_in_block(lo, hi, first, step)))

        # One more element, empty, so that the concat of no stored block needs no tf.cond.
        parts = tf.TensorArray(dtype, size=blocks + 1, infer_shape=False,
                               element_shape=tf.TensorShape([None] * rank))
        parts = parts.write(blocks, tf.zeros(tf.concat([[0], shape[1:]], 0), dtype))
        _, parts = tf.while_loop(lambda b, _: b < blocks, body, [tf.constant(0), parts], parallel_iterations=1)
        return parts.concat()

    return traced.once(read_held_rows)
