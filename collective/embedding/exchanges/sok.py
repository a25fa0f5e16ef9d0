"""``sok``, after SparseOperationKit.

- Combined lookups (``DistributedEmbedding``): one allgather of every
  request's ``(id, sample, table, weight)``; each rank gathers the rows it
  holds and combines them per sample and table; one reduce-scatter of
  ``[samples, sum of widths]`` hands every rank its own samples. Tables of
  any width share it (per dtype).
- Plain lookups (``All2AllDenseEmbedding``): bucket by owner, alltoall,
  gather, alltoall back, without deduplication.
"""

from __future__ import annotations

from typing import Hashable, List

import tensorflow as tf

from collective import comm
from collective.embedding import combiners
from collective.embedding.exchanges.base import Exchange, Prepared, fetch_from_owners, finish, owned_rows


class SokExchange(Exchange):
    """SparseOperationKit's exchanges."""

    name = "sok"

    def group_key(self, p: Prepared) -> Hashable:
        if p.req.plain:
            return ("alltoall",) + super().group_key(p)
        return ("allgather", p.dtype, id(p.req.table) if p.info.hash_index is not None else None)

    def exchange(self, group: List[Prepared]) -> List[tf.Tensor]:
        if group[0].req.plain:
            return [finish(p, v) for p, v in zip(group, fetch_from_owners(group, dedup=False))]
        return _combine_where_held(group)


def _combine_where_held(group: List[Prepared]) -> List[tf.Tensor]:
    """Allgather the ids, combine the rows held here per sample, reduce-scatter the partial sums."""
    layout = group[0].info.layout
    n = layout.world_size
    dtype = group[0].dtype
    own_rows = tf.reduce_max(tf.stack([p.num_segments for p in group]))
    block = tf.reduce_max(comm.allgather(tf.reshape(own_rows, [1])))
    rank = comm.rank_tensor()
    columns = [tf.stack([p.ids, p.segments + rank * block, tf.fill(tf.shape(p.ids), tf.constant(t, tf.int64)),
                         _weight_bits(p.weights)], axis=1) for t, p in enumerate(group)]
    gathered = comm.allgather(tf.concat(columns, axis=0))
    all_ids, all_segments, all_tables = gathered[:, 0], gathered[:, 1], gathered[:, 2]
    all_weights = _gathered_weights(gathered[:, 3], group, dtype)
    total_rows = block * n
    held = layout.owns(all_ids)
    partials = []
    for t, p in enumerate(group):
        of_table = tf.equal(all_tables, t)
        here = tf.logical_and(held, of_table)
        vectors = owned_rows(p, tf.boolean_mask(all_ids, here)) * tf.boolean_mask(all_weights, here)[:, None]
        summed = tf.math.unsorted_segment_sum(vectors, tf.boolean_mask(all_segments, here), total_rows)
        norm = combiners.normaliser(tf.boolean_mask(all_weights, of_table), tf.boolean_mask(all_segments, of_table),
                                    total_rows, p.req.combiner)
        partials.append(combiners.normalise(summed, norm))
    own = comm.reducescatter(tf.concat(partials, axis=1), "sum")
    widths = [p.info.dim for p in group]
    return [part[:p.num_segments] for part, p in zip(tf.split(own, widths, axis=1), group)]


def _weight_bits(weights: tf.Tensor) -> tf.Tensor:
    """Weights as int64 bit patterns, so that they travel in the id allgather."""
    if weights.dtype == tf.float64:
        return tf.bitcast(weights, tf.int64)
    return tf.cast(tf.bitcast(tf.cast(weights, tf.float32), tf.int32), tf.int64)


def _weights_from_bits(bits: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    if dtype == tf.float64:
        return tf.bitcast(bits, tf.float64)
    return tf.cast(tf.bitcast(tf.cast(bits, tf.int32), tf.float32), dtype)


def _gathered_weights(bits: tf.Tensor, group: List[Prepared], dtype: tf.DType) -> tf.Tensor:
    """Every rank's weights from their bits, differentiable with respect to this rank's given weights.

    The bits carry no gradient. The gradient of an allgather is the sum over
    ranks of the gradient at this rank's rows (as Horovod's own allgather
    gradient): an allreduce that runs only when weights need a gradient.
    """
    decoded = _weights_from_bits(bits, dtype)
    if not any(p.weighted for p in group):
        return decoded
    own = tf.concat([p.weights for p in group], axis=0)

    @tf.custom_gradient
    def gathered(local):  # pylint: disable=unused-argument
        def grad(upstream):
            counts = comm.allgather(tf.reshape(tf.size(local, out_type=tf.int64), [1]))
            start = tf.reduce_sum(counts[:comm.rank_tensor()])
            return tf.slice(comm.allreduce(upstream, "sum"), [start], [tf.size(local, out_type=tf.int64)])

        return tf.identity(decoded), grad

    return gathered(own)
