"""Variables derived from a sharded table, as users write them: an EMA of the table, a ``zeros_like`` accumulator,
a user's ``tf.compat.v1.train.Saver`` over ``ema.variables_to_restore()`` and an export with that scaffold saver.

A 5-row table (not divisible by 2 or 3 workers) and a dense ``[2, 1]``
weight, trained by SGD on a squared error; every step also averages both
with ``ExponentialMovingAverage(0.5)`` and adds the table's gradient into
``acc = tf.Variable(tf.zeros_like(table))``. The workers build it inside
``CollectiveStrategy``; :func:`reference` builds it in one plain process.
"""

import contextlib

import numpy as np
import tensorflow as tf

VOCAB, DIM, GLOBAL_BATCH, STEPS = 5, 2, 6, 3
TABLE = np.linspace(-1.0, 1.0, VOCAB * DIM).reshape(VOCAB, DIM).astype(np.float32)
W = np.array([[0.5], [-0.25]], np.float32)
DECAY = 0.5
SERVE_IDS = np.arange(VOCAB, dtype=np.int64)
KEYS = ("table", "table/ExponentialMovingAverage", "acc", "w", "w/ExponentialMovingAverage")


def global_batch(step: int):
    rng = np.random.default_rng(100 + step)
    return rng.integers(0, VOCAB, GLOBAL_BATCH).astype(np.int64), rng.normal(0, 1, (GLOBAL_BATCH, 1)).astype(
        np.float32)


def local_batch(step: int, rank: int, n: int):
    ids, labels = global_batch(step)
    per = GLOBAL_BATCH // n
    return ids[rank * per:(rank + 1) * per], labels[rank * per:(rank + 1) * per]


def variables(strategy=None):
    scope = strategy.embedding_scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        table = tf.compat.v1.get_variable("table", [VOCAB, DIM], initializer=tf.compat.v1.constant_initializer(TABLE))
    w = tf.compat.v1.get_variable("w", [DIM, 1], initializer=tf.compat.v1.constant_initializer(W))
    return table, w


def logits(ids, table, w):
    return tf.matmul(tf.nn.embedding_lookup(table, ids), w)


def build_training(strategy=None):
    """(train_op, ids, labels, shadow): SGD, then the EMA of table and w (``shadow``: the table's), and the
    table's gradient summed into ``acc``."""
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
    table, w = variables(strategy)
    acc = tf.Variable(tf.zeros_like(table), trainable=False, name="acc")
    loss = tf.reduce_mean(tf.square(logits(ids, table, w) - labels))
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.5)
    grads = optimizer.compute_gradients(loss, [table, w])
    table_grad = grads[0][0]
    accumulate = tf.compat.v1.scatter_add(acc, table_grad.indices, table_grad.values)
    with tf.control_dependencies([accumulate]):
        apply = optimizer.apply_gradients(grads, global_step=tf.compat.v1.train.get_or_create_global_step())
    ema = tf.compat.v1.train.ExponentialMovingAverage(DECAY)
    with tf.control_dependencies([apply]):
        train_op = ema.apply([table, w])
    return train_op, ids, labels, ema.average(table)


def serving_model_fn(strategy=None):
    """A PREDICT model_fn whose scaffold saver reads the EMA weights into the model (the serving recipe)."""
    def model_fn(features, mode):
        table, w = variables(strategy)
        saver = tf.compat.v1.train.Saver(tf.compat.v1.train.ExponentialMovingAverage(DECAY).variables_to_restore())
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits(features["ids"], table, w)},
                                          scaffold=tf.compat.v1.train.Scaffold(saver=saver))

    return model_fn


def serving_input_receiver_fn():
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    return tf.estimator.export.ServingInputReceiver({"ids": ids}, {"ids": ids})


def reference() -> dict:
    """One plain process on the global batches: every checkpoint key of :data:`KEYS`."""
    with tf.Graph().as_default():
        train_op, ids, labels, _ = build_training()
        variables_by_name = {v.op.name: v for v in tf.compat.v1.global_variables()}
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for step in range(STEPS):
                batch_ids, batch_labels = global_batch(step)
                sess.run(train_op, {ids: batch_ids, labels: batch_labels})
            return sess.run({key: variables_by_name[key] for key in KEYS})


def ema_logits(state: dict) -> np.ndarray:
    """The logits of :data:`SERVE_IDS` with the EMA weights of ``state`` (:func:`reference`)."""
    return state["table/ExponentialMovingAverage"][SERVE_IDS] @ state["w/ExponentialMovingAverage"]
