"""TensorFlow's embedding lookups, routed to the exchange when the table is sharded.

These replace functions of ``tensorflow.python.ops.embedding_ops`` inside
``CollectiveStrategy.scope()`` (see :mod:`collective.tf_internals.patches`); any other
table goes to TensorFlow's own implementation unchanged.
"""

from __future__ import annotations

import tensorflow as tf

from collective.embedding import coalescing
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


def embedding_lookup(params, ids, partition_strategy="mod", name=None, validate_indices=True, max_norm=None):
    """``tf.compat.v1.nn.embedding_lookup`` (and, through it, the v2 name)."""
    table, info = _sharded(params)
    if table is None:
        return patches.original(embedding_ops, "embedding_lookup")(
            params, ids, partition_strategy=partition_strategy, name=name,
            validate_indices=validate_indices, max_norm=max_norm)
    with tf.name_scope(name or "embedding_lookup"):
        return _clip(sharded.lookup(table, info, ids), max_norm)


def embedding_lookup_sparse_impl(params, segment_ids, sp_weights, ids, combiner, ignore_weights, max_norm,
                                 allow_fast_lookup, partition_strategy, name):
    """The shared body of ``embedding_lookup_sparse`` and ``safe_embedding_lookup_sparse``."""
    table, info = _sharded(params)
    if table is None:
        return patches.original(embedding_ops, "embedding_lookup_sparse_impl")(
            params, segment_ids, sp_weights, ids, combiner, ignore_weights, max_norm, allow_fast_lookup,
            partition_strategy, name)
    if max_norm is not None:
        raise ValueError(f"max_norm is not supported for the sharded table '{info.name}'; clip the combined "
                         "vectors instead")
    weights = None if ignore_weights else sp_weights.values
    if coalescing.can_defer():
        return coalescing.defer(sharded.Request(table, info, ids, segment_ids, weights, combiner or "mean"))
    return sharded.lookup_sparse(table, info, ids, segment_ids, weights, combiner or "mean")


patches.register(embedding_ops, "embedding_lookup", embedding_lookup,
                 "lookups on sharded tables go through the exchange")
patches.register(tf.compat.v1.nn, "embedding_lookup", embedding_lookup, "the same, under its public v1 name")
patches.register(embedding_ops, "embedding_lookup_sparse_impl", embedding_lookup_sparse_impl,
                 "combined lookups (embedding_lookup_sparse, the safe_ variant, feature columns) likewise")
