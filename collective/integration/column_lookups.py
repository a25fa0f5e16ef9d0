"""TensorFlow's feature-column entry points, adapted to sharded tables.

Installed by :mod:`collective.tf_internals.patches` inside ``CollectiveStrategy.scope()``:

- v1 ``input_layer`` and Keras ``DenseFeatures`` (v1 and v2) run TensorFlow's
  own code inside :func:`collective.embedding.coalescing.coalescing`, so the
  sharded lookups of all their columns share one grouped exchange.
- v1 ``shared_embedding_columns`` keep their table in a graph collection and
  check its shape against the logical ``[vocab, dim]``; a sharded table holds
  fewer rows, so later columns are handed the collected table directly.
"""

from __future__ import annotations

import tensorflow as tf

from collective.embedding.coalescing import coalescing
from collective.embedding.table import shard_of
from collective.tf_internals import dense_features, patches
from collective.tf_internals import feature_column_v1 as fc_v1


def internal_input_layer(*args, **kwargs):
    """``feature_column._internal_input_layer`` (behind v1 ``input_layer``), with its sharded lookups coalesced."""
    with coalescing():
        return patches.original(fc_v1, "_internal_input_layer")(*args, **kwargs)


def dense_features_call(self, features, cols_to_output_tensors=None, training=None):
    """Keras ``DenseFeatures.call`` (v1 and v2), with its sharded lookups coalesced."""
    with coalescing():
        return patches.original(dense_features.DenseFeatures, "call")(
            self, features, cols_to_output_tensors=cols_to_output_tensors, training=training)


def shared_embedding_dense_tensor(self, inputs, weight_collections=None, trainable=None):
    """``_SharedEmbeddingColumn._get_dense_tensor_internal`` that accepts a sharded shared table."""
    original = patches.original(fc_v1._SharedEmbeddingColumn,  # pylint: disable=protected-access
                                "_get_dense_tensor_internal")
    collection = tf.compat.v1.get_collection_ref(self.shared_embedding_collection_name)
    if len(collection) != 1 or shard_of(collection[0]) is None:
        return original(self, inputs, weight_collections=weight_collections, trainable=trainable)
    table, saved = collection[0], list(collection)

    def collected_table(getter, name, *args, **kwargs):  # pylint: disable=unused-argument
        return table

    del collection[:]
    try:
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), custom_getter=collected_table,
                                         auxiliary_name_scope=False):
            return original(self, inputs, weight_collections=weight_collections, trainable=trainable)
    finally:
        collection[:] = saved
