"""TensorFlow's embedding lookups, routed to the exchange when the table is sharded.

These replace functions of ``tensorflow.python.ops.embedding_ops`` inside
``CollectiveStrategy.scope()`` (see :mod:`collective.tf_internals.patches`); any other
table goes to TensorFlow's own implementation unchanged.
"""

from __future__ import annotations

import tensorflow as tf

from collective.embedding import coalescing, gradient_norms, masking
from collective.embedding import lookup as sharded
from collective.embedding.table import shard_of
from collective.tf_internals import embedding_ops, patches


def _sharded(params):
    if isinstance(params, (list, tuple)):
        if len(params) == 1:
            params = params[0]
        elif any(shard_of(p) for p in params):
            raise ValueError("a sharded embedding table cannot be combined with other partitions in one lookup; "
                             "create it as one variable inside embedding_scope()")
        else:
            return None, None
    info = shard_of(params)
    return (params, info) if info is not None else (None, None)


def _clip(vectors: tf.Tensor, max_norm) -> tf.Tensor:
    return vectors if max_norm is None else tf.clip_by_norm(vectors, max_norm, axes=[-1])


@tf.autograph.experimental.do_not_convert
def embedding_lookup(params, ids, partition_strategy="mod", name=None, validate_indices=True, max_norm=None):
    """``tf.compat.v1.nn.embedding_lookup`` (and, through it, the v2 name).

    Ragged ids (TensorFlow dispatches them to its ragged lookup from the
    original function only) look up their flat values and keep their row splits.
    """
    if isinstance(ids, tf.RaggedTensor):
        return ids.with_flat_values(embedding_lookup(params, ids.flat_values, partition_strategy=partition_strategy,
                                                     name=name, validate_indices=validate_indices,
                                                     max_norm=max_norm))
    table, info = _sharded(params)
    if table is None:
        out = patches.original(embedding_ops, "embedding_lookup")(
            params, ids, partition_strategy=partition_strategy, name=name,
            validate_indices=validate_indices, max_norm=max_norm)
        if not isinstance(params, (list, tuple)):
            gradient_norms.record(params, out)
        return out
    with tf.name_scope(name or "embedding_lookup"):
        return _clip(sharded.lookup(table, info, ids), max_norm)


@tf.autograph.experimental.do_not_convert
def embedding_lookup_sparse_impl(params, segment_ids, sp_weights, ids, combiner, ignore_weights, max_norm,
                                 allow_fast_lookup, partition_strategy, name):
    """The shared body of ``embedding_lookup_sparse`` and ``safe_embedding_lookup_sparse``."""
    table, info = _sharded(params)
    if table is None:
        with gradient_norms.muted():  # TensorFlow's embedding_lookup inside: this records the combined lookup
            out = patches.original(embedding_ops, "embedding_lookup_sparse_impl")(
                params, segment_ids, sp_weights, ids, combiner, ignore_weights, max_norm, allow_fast_lookup,
                partition_strategy, name)
        if not isinstance(params, (list, tuple)) or len(params) == 1:
            gradient_norms.record(params[0] if isinstance(params, (list, tuple)) else params, out, combiner or "mean")
        return out
    if max_norm is not None:
        raise ValueError(f"max_norm is not supported for the sharded table '{info.name}'; clip the combined "
                         "vectors instead")
    weights = None if ignore_weights else sp_weights.values
    # TensorFlow's lookup takes segment ids in ascending order (a SparseTensor in canonical order): so does this.
    request = sharded.Request(table, info, ids, segment_ids, weights, combiner or "mean", sorted_segments=True)
    return coalescing.defer(request) if coalescing.can_defer() else sharded.run([request])[0]


@tf.autograph.experimental.do_not_convert
def safe_embedding_lookup_sparse(embedding_weights, sparse_ids, sparse_weights=None, combiner="mean",
                                 default_id=None, name=None, partition_strategy="div", max_norm=None,
                                 allow_fast_lookup=False):
    """``safe_embedding_lookup_sparse`` (v1; v2 and the embedding columns call it too).

    On a hash-table vocabulary without ``default_id`` the empty rows give
    zeros without a lookup: TensorFlow fills them with id 0 and zeroes the
    result afterwards, and that lookup would insert a key 0 that no input holds.
    """
    table, info = _sharded(embedding_weights)
    if table is None or info.hash_index is None or default_id is not None:
        return patches.original(embedding_ops, "safe_embedding_lookup_sparse")(
            embedding_weights, sparse_ids, sparse_weights=sparse_weights, combiner=combiner, default_id=default_id,
            name=name, partition_strategy=partition_strategy, max_norm=max_norm, allow_fast_lookup=allow_fast_lookup)
    if max_norm is not None:
        raise ValueError(f"max_norm is not supported for the sharded table '{info.name}'; clip the combined "
                         "vectors instead")
    with tf.name_scope(name or "embedding_lookup"):
        shape = tf.cast(sparse_ids.dense_shape, tf.int64)
        rows = tf.reduce_prod(shape[:-1])
        ids = tf.sparse.reshape(sparse_ids, tf.stack([rows, shape[-1]]))
        keep = ids.values >= 0  # TensorFlow prunes negative ids, then (but for sum) weights <= 0
        if sparse_weights is not None and combiner != "sum":
            keep = tf.logical_and(keep, sparse_weights.values > 0)
        weights = None if sparse_weights is None else masking.select(sparse_weights.values, keep)
        request = sharded.Request(table, info, masking.select(ids.values, keep),
                                  masking.select(ids.indices[:, 0], keep), weights, combiner or "mean", rows,
                                  sorted_segments=True)
        combined = coalescing.defer(request) if coalescing.can_defer() else sharded.run([request])[0]
        return tf.reshape(combined, tf.concat([shape[:-1], [info.dim]], axis=0))
