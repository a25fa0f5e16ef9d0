"""The id/vector exchanges behind a sharded lookup: ``hb`` and ``sok``.

Both take a sharded table's local variable and this worker's ids and return
this worker's vectors; gradients flow back through the collectives to the
local variable as ``IndexedSlices``.

- ``hb`` (HybridBackend): unique ids, bucket by owner ``id % N``, one
  alltoall of ids, local gather, one alltoall of vectors, restore order, then
  the combiner on this worker.
- ``sok`` (SparseOperationKit): lookups with a combiner follow
  ``DistributedEmbedding``: allgather ids with their sample index, gather and
  combine the local rows per sample, reduce-scatter back to each sample's
  worker. Plain lookups follow ``All2AllDenseEmbedding``: bucket, alltoall,
  gather, alltoall back, without deduplication on the wire.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from collective import comm
from collective.embedding.table import ShardInfo

COMBINERS = ("sum", "mean", "sqrtn")


def checked_ids(ids: tf.Tensor, info: ShardInfo) -> tf.Tensor:
    """``ids`` as int64, with an assertion that names the table when one is out of range.

    Hash-table vocabularies take every int64 key: nothing to check.
    """
    ids = tf.cast(ids, tf.int64)
    if info.hash_index is not None:
        return ids
    valid = tf.logical_and(ids >= 0, ids < info.vocab)
    bad = tf.boolean_mask(ids, tf.logical_not(valid))
    check = tf.debugging.Assert(
        tf.reduce_all(valid),
        [f"embedding table {info.name} has {info.vocab} rows but got ids outside [0, {info.vocab}): "
         "fix the feature that feeds it (negative ids or ids >= the vocabulary size), or hash or clip the "
         "ids before the lookup. First offending ids:", bad[:10]],
        summarize=10)
    with tf.control_dependencies([check]):
        return tf.identity(ids)


def owned_vectors(table: tf.Variable, info: ShardInfo, ids: tf.Tensor) -> tf.Tensor:
    """Vectors of int64 ``ids`` this worker owns (``id % N == rank``), read from its shard ``table``."""
    if info.hash_index is not None:
        return info.hash_index.owned_vectors(table, ids)
    return tf.gather(table, ids // info.world_size)


def _rows_by_owner(table: tf.Variable, info: ShardInfo, ids: tf.Tensor) -> tf.Tensor:
    """Vectors for 1-D int64 ``ids`` fetched from their owners, in the order of ``ids``."""
    n = info.world_size
    owner = tf.cast(ids % n, tf.int32)
    order = tf.argsort(owner, stable=True)
    splits = tf.math.bincount(owner, minlength=n, maxlength=n, dtype=tf.int32)
    owned, received = comm.alltoall(tf.gather(ids, order), splits)
    vectors = owned_vectors(table, info, owned)
    returned, _ = comm.alltoall(vectors, received)
    return tf.gather(returned, tf.math.invert_permutation(order))


def lookup(table: tf.Variable, info: ShardInfo, ids: tf.Tensor, backend: str) -> tf.Tensor:
    """``tf.nn.embedding_lookup`` on a sharded table: vectors of shape ``ids.shape + [dim]``."""
    ids = tf.convert_to_tensor(ids)
    flat = checked_ids(tf.reshape(ids, [-1]), info)
    if info.world_size == 1:
        vectors = owned_vectors(table, info, flat)
    elif backend == "hb":
        unique, index = tf.unique(flat, out_idx=tf.int32)
        vectors = tf.gather(_rows_by_owner(table, info, unique), index)
    else:
        vectors = _rows_by_owner(table, info, flat)
    out = tf.reshape(vectors, tf.concat([tf.shape(ids), [info.dim]], axis=0))
    out.set_shape(ids.shape.concatenate([info.dim]))
    return out


def _normaliser(weights: tf.Tensor, segments: tf.Tensor, num_segments, combiner: str) -> Optional[tf.Tensor]:
    if combiner == "sum":
        return None
    total = tf.math.unsorted_segment_sum(weights if combiner == "mean" else tf.square(weights), segments,
                                         num_segments)
    if combiner == "sqrtn":
        total = tf.sqrt(total)
    return tf.where(total > 0, total, tf.ones_like(total))


def lookup_sparse(table: tf.Variable, info: ShardInfo, ids: tf.Tensor, segments: tf.Tensor,
                  weights: Optional[tf.Tensor], combiner: str, backend: str) -> tf.Tensor:
    """Combined vectors per segment (sample): ``[max(segments) + 1, dim]``, as TensorFlow's own lookup."""
    if combiner not in COMBINERS:
        raise ValueError(f"combiner {combiner!r} for table '{info.name}' is not one of {', '.join(COMBINERS)}")
    ids = checked_ids(ids, info)
    segments = tf.cast(segments, tf.int64)
    num_segments = tf.cast(tf.reduce_max(tf.concat([segments, [-1]], axis=0)) + 1, tf.int64)
    weights = tf.ones_like(ids, dtype=table.dtype) if weights is None else tf.cast(weights, table.dtype)
    if backend == "sok" and info.world_size > 1:
        return _distributed_combine(table, info, ids, segments, weights, num_segments, combiner)
    if info.world_size == 1:
        vectors = owned_vectors(table, info, ids)
    else:
        unique, index = tf.unique(ids, out_idx=tf.int32)
        vectors = tf.gather(_rows_by_owner(table, info, unique), index)
    combined = tf.math.unsorted_segment_sum(vectors * weights[:, None], segments, num_segments)
    norm = _normaliser(weights, segments, num_segments, combiner)
    return combined if norm is None else combined / norm[:, None]


def _distributed_combine(table, info, ids, segments, weights, num_segments, combiner):
    """SOK's DistributedEmbedding: allgather ids, combine local rows per sample, reduce-scatter."""
    n, r = info.world_size, info.rank
    batch_sizes = comm.allgather(tf.reshape(num_segments, [1]))
    block = tf.reduce_max(batch_sizes)
    global_segments = segments + comm.rank_tensor() * block
    gathered = comm.allgather(tf.stack([ids, global_segments], axis=1))
    all_ids, all_segments = gathered[:, 0], gathered[:, 1]
    all_weights = comm.allgather(weights)
    total_rows = block * n
    mine = tf.equal(all_ids % n, r)
    vectors = owned_vectors(table, info, tf.boolean_mask(all_ids, mine))
    vectors = vectors * tf.boolean_mask(all_weights, mine)[:, None]
    partial = tf.math.unsorted_segment_sum(vectors, tf.boolean_mask(all_segments, mine), total_rows)
    norm = _normaliser(all_weights, all_segments, total_rows, combiner)
    if norm is not None:
        partial = partial / norm[:, None]
    return comm.reducescatter(partial, "sum")[:num_segments]
