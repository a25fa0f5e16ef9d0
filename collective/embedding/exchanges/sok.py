"""``sok``, after SparseOperationKit (its v2 ``lookup_sparse``).

- Combined lookups (``DistributedEmbedding``, SOK v2's ``lookup_sparse``):
  one allgather of every request's ``(id, sample)`` (and weight, when the
  caller gave weights); each rank gathers the rows it holds and sums them
  per sample and table; one alltoall hands every rank the partial sums of
  its own samples from each holder, which it adds up and normalises
  (``mean``, ``sqrtn``) with its own weights. Tables of any width share it
  (per dtype). SOK v2 returns the partial sums with an alltoall as here;
  this backend used a reduce-scatter of ``[N x the largest batch, widths]``
  before, which moved the same bytes plus padding and needed an extra
  allgather of batch sizes.
- Plain lookups (``All2AllDenseEmbedding``): bucket by owner, alltoall,
  gather, alltoall back, without deduplication.
- Column-wise tables, plain and combined: every id's slices from every rank
  (:mod:`.column_wise`), without deduplication, combined on the rank that asked.
"""

from __future__ import annotations

from typing import Dict, Hashable, List

import tensorflow as tf

from collective import comm
from collective.embedding import combiners
from collective.embedding.exchanges.base import Exchange, Prepared, fetch_from_owners, finish, owned_rows, \
    tagged_keys
from collective.embedding.exchanges.column_wise import fetch_slices


class SokExchange(Exchange):
    """SparseOperationKit's exchanges."""

    name = "sok"

    def group_key(self, p: Prepared) -> Hashable:
        if p.req.plain or p.info.column_wise:
            return ("alltoall",) + super().group_key(p)
        return ("allgather", p.dtype, id(p.req.table) if p.info.hash_index is not None else None, p.info.holder)

    def exchange(self, group: List[Prepared]) -> List[tf.Tensor]:
        if group[0].info.column_wise:
            return [finish(p, v) for p, v in zip(group, fetch_slices(group, [p.ids for p in group]))]
        if group[0].req.plain:
            return [finish(p, v) for p, v in zip(group, fetch_from_owners(group, [p.ids for p in group]))]
        return _combine_where_held(group)


_END = -1  # the sample column of the row that closes each rank's part of the allgather


def _combine_where_held(group: List[Prepared]) -> List[tf.Tensor]:
    """Allgather the ids, sum the rows held here per sample, alltoall the partial sums back, normalise.

    Each rank's part of the allgather is its rows ``(key, sample[, weight
    bits])`` (keys as :func:`tagged_keys`) closed by one row ``(samples,
    -1)``: from those every rank knows each row's source rank and every
    rank's sample count without another collective.
    """
    layout = group[0].info.layout
    count, dtype = len(group), group[0].dtype
    weighted = any(p.weighted for p in group)
    samples = tf.reduce_max(tf.stack([p.num_segments for p in group]))
    columns = [tagged_keys([p.ids for p in group]), tf.concat([p.segments for p in group], axis=0)]
    end = [samples, tf.constant(_END, tf.int64)]
    if weighted:
        columns.append(_weight_bits(tf.concat([_weights_or_ones(p) for p in group], axis=0)))
        end.append(tf.constant(0, tf.int64))
    gathered = comm.allgather(tf.concat([tf.stack(columns, axis=1), tf.reshape(tf.stack(end), [1, -1])], axis=0))
    keys, local_samples = gathered[:, 0], gathered[:, 1]
    is_end = tf.equal(local_samples, _END)
    counts = tf.boolean_mask(keys, is_end)                    # every rank's samples, in rank order
    source = tf.cumsum(tf.cast(is_end, tf.int32), exclusive=True)
    first = tf.cumsum(counts, exclusive=True)                 # each rank's first row in the partial sums
    here = tf.reshape(tf.where(tf.logical_and(layout.owns(keys // count if count > 1 else keys),
                                              tf.logical_not(is_end))), [-1])
    held_keys = tf.gather(keys, here)
    held_samples = tf.gather(local_samples + tf.gather(first, source), here)
    held_weights = None
    if weighted:
        held_weights = tf.gather(_gathered_weights(gathered[:, 2], group, dtype), here)
    partial, columns_of = _partial_sums(group, held_keys, held_samples, held_weights, tf.reduce_sum(counts))
    received, _ = comm.alltoall(partial, tf.cast(counts, tf.int32))
    own = tf.reduce_sum(tf.reshape(received, [layout.world_size, -1, partial.shape[1]]), axis=0)
    # One split (its gradient is one concat) rather than a slice per table (each slice's gradient is a
    # zero tensor of the whole width, summed over the tables).
    by_column = sorted(range(count), key=lambda t: columns_of[t][0])
    pieces = tf.split(own, [columns_of[t][1] - columns_of[t][0] for t in by_column], axis=1)
    piece_of = {t: piece for t, piece in zip(by_column, pieces)}
    out = []
    for t, p in enumerate(group):
        summed = piece_of[t][:p.num_segments]
        norm = combiners.normaliser(p.weights, p.segments, p.num_segments, p.req.combiner, dtype)
        combined = combiners.normalise(summed, norm)
        combined.set_shape([None, p.info.dim])
        out.append(combined)
    return out


def _partial_sums(group: List[Prepared], keys: tf.Tensor, samples: tf.Tensor, weights, rows: tf.Tensor):
    """``[rows, sum of widths]``: per sample, the weighted sum of each table's rows held here.

    Tables of one width share one segment sum. Returns the sums and each
    request's ``(first, last)`` column.
    """
    count = len(group)
    if count > 1:
        which = tf.cast(keys % count, tf.int32)
        ids = tf.dynamic_partition(keys // count, which, count)
        samples_of = tf.dynamic_partition(samples, which, count)
        weights_of = tf.dynamic_partition(weights, which, count) if weights is not None else [None] * count
    else:
        ids, samples_of, weights_of = [keys], [samples], [weights]
    by_width: Dict[int, List[int]] = {}
    for t, p in enumerate(group):
        by_width.setdefault(p.info.dim, []).append(t)
    blocks, columns_of, at = [], [None] * count, 0
    for width, tables in by_width.items():
        vectors, segments = [], []
        for j, t in enumerate(tables):
            rows_t = owned_rows(group[t], ids[t])
            vectors.append(rows_t if weights_of[t] is None else rows_t * weights_of[t][:, None])
            segments.append(samples_of[t] * len(tables) + j)
            columns_of[t] = (at + j * width, at + (j + 1) * width)
        summed = combiners.segment_sum(tf.concat(vectors, axis=0), tf.concat(segments, axis=0),
                                       rows * len(tables))
        blocks.append(tf.reshape(summed, [-1, len(tables) * width]))
        at += len(tables) * width
    return tf.concat(blocks, axis=1) if len(blocks) > 1 else blocks[0], columns_of


def _weights_or_ones(p: Prepared) -> tf.Tensor:
    return p.weights if p.weights is not None else tf.ones_like(p.ids, dtype=p.dtype)


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
    Each rank's rows are followed by its closing row.
    """
    decoded = _weights_from_bits(bits, dtype)
    own = tf.concat([_weights_or_ones(p) for p in group], axis=0)

    @tf.custom_gradient
    def gathered(local):  # pylint: disable=unused-argument
        def grad(upstream):
            size = tf.size(local, out_type=tf.int64)
            rows = comm.allgather(tf.reshape(size + 1, [1]))
            start = tf.reduce_sum(rows[:comm.rank_tensor()])
            return tf.slice(comm.allreduce(tf.convert_to_tensor(upstream), "sum"), [start], [size])

        return tf.identity(decoded), grad

    return gathered(own)
