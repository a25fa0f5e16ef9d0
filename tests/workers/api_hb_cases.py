"""A small model for the hb optimizer-wrapper tests, built with hb.train or with TensorFlow's optimizers.

Workers build it with ``hb.train.<Name>Optimizer`` (inside or outside
``hb.scope()``) on their share of each global batch; the test builds it in
one plain TensorFlow process with ``tf.compat.v1.train.<Name>Optimizer`` on
the whole batch (data from embedding_cases).
"""

import contextlib

import numpy as np
import tensorflow as tf

import embedding_cases as cases

OPTIMIZERS = {
    "GradientDescentOptimizer": dict(learning_rate=0.5),
    "AdagradOptimizer": dict(learning_rate=0.4),
    "AdamOptimizer": dict(learning_rate=0.05),
    "FtrlOptimizer": dict(learning_rate=0.3, l1_regularization_strength=0.001),
    "RMSPropOptimizer": dict(learning_rate=0.05),
    "MomentumOptimizer": dict(learning_rate=0.3, momentum=0.9),
}


class PlainSGD(tf.compat.v1.train.Optimizer):
    """A user optimizer written against tf.compat.v1.train.Optimizer (HybridBackend's "customized optimizer")."""

    def __init__(self, learning_rate, use_locking=False, name="PlainSGD"):
        super().__init__(use_locking, name)
        self._lr = learning_rate

    def _resource_apply_dense(self, grad, handle):
        return handle.assign_sub(self._lr * grad)

    def _resource_apply_sparse(self, grad, handle, indices):
        return tf.compat.v1.scatter_sub(handle, indices, self._lr * grad) if not hasattr(handle, "scatter_sub") \
            else handle.scatter_sub(tf.IndexedSlices(self._lr * grad, indices))

    def _apply_dense(self, grad, var):
        return var.assign_sub(self._lr * grad)


class OverridingSGD(PlainSGD):
    """A user optimizer that overrides ``apply_gradients`` and calls ``super()`` (to log or clip, say)."""

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        return super().apply_gradients(list(grads_and_vars), global_step=global_step, name=name)


def build(optimizer, embedding_scope=contextlib.nullcontext):
    """The model on placeholders; ``optimizer`` is an optimizer instance. Returns (loss, train_op, vars, feed)."""
    dense_ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
    labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
    with embedding_scope():
        table = tf.compat.v1.get_variable("t1", [cases.VOCAB, cases.DIM],
                                          initializer=tf.compat.v1.constant_initializer(cases.table_values(1)))
        emb = tf.reshape(tf.nn.embedding_lookup(table, dense_ids), [-1, 2 * cases.DIM])
    w = tf.compat.v1.get_variable("w", [2 * cases.DIM, 1], initializer=tf.compat.v1.constant_initializer(
        np.linspace(-0.3, 0.3, 2 * cases.DIM).reshape(-1, 1)))
    logits = tf.matmul(tf.nn.relu(emb), w)
    tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    loss = tf.compat.v1.losses.get_total_loss()
    train_op = optimizer.minimize(loss)

    def feed(batch):
        dense, _, lab = batch
        return {dense_ids: dense, labels: lab}

    return loss, train_op, (table, w), feed


def train(optimizer_fn, batches, embedding_scope=contextlib.nullcontext, outer=contextlib.nullcontext):
    """Losses and final (table, w) after one step per batch."""
    with tf.Graph().as_default(), outer():
        loss, train_op, variables, feed = build(optimizer_fn(), embedding_scope)
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            losses = [sess.run([loss, train_op], feed(b))[0] for b in batches]
            return np.array(losses), sess.run(variables)
