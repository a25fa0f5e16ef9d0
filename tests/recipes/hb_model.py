"""The model both HybridBackend recipe tests fill the recipes' ``# ...`` with.

``c`` (an int64 id) is looked up in a 20 x 4 table made in
``hb.embedding_scope()``, concatenated with ``a`` (a float), and a linear layer
gives one logit; fixed initial values, so one process can replay the training.
"""
import numpy as np
import tensorflow.compat.v1 as tf

import collective.hb as hb

VOCAB, DIM = 20, 4
TABLE = np.random.default_rng(3).normal(0, 0.5, (VOCAB, DIM)).astype(np.float32)
W = np.linspace(-0.5, 0.5, DIM + 1).reshape(-1, 1).astype(np.float32)


def logits_and_variables(features):
    """``(logits [batch, 1], table, w)``; a SparseTensor ``c`` (serving placeholders) holds one id per row."""
    ids = features["c"]
    if isinstance(ids, tf.SparseTensor):
        ids = tf.sparse.to_dense(ids)[:, 0]
    with hb.embedding_scope():
        table = tf.get_variable("c_table", [VOCAB, DIM], initializer=tf.constant_initializer(TABLE))
        emb = tf.nn.embedding_lookup(table, ids)
    w = tf.get_variable("w", [DIM + 1, 1], initializer=tf.constant_initializer(W))
    x = tf.concat([emb, tf.reshape(tf.cast(features["a"], tf.float32), [-1, 1])], axis=1)
    return tf.matmul(x, w), table, w
