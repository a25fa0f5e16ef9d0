"""Several tables of mixed dimensions and their data, built alike with and without collective.

Workers look them up with ``collective.embedding.lookup.lookup_sparse_group``
on their share of each global batch; the tests compare with numpy and with
plain single-process TensorFlow on the whole batch.
"""

import contextlib

import numpy as np
import tensorflow as tf


BATCH, STEPS, WIDTH = 12, 3, 3
# name, vocab, dim, combiner, weighted
TABLES = (("ta", 23, 4, "mean", False), ("tb", 17, 4, "sum", True), ("tc", 11, 3, "sqrtn", True),
          ("td", 19, 4, "sqrtn", False))


def table_values(index: int, vocab: int, dim: int) -> np.ndarray:
    return np.random.default_rng(10 + index).normal(0, 0.5, (vocab, dim)).astype(np.float32)


def sparse_feature(rng, vocab: int, min_len: int = 1):
    """(rows, ids, weights) with ``min_len``..WIDTH ids per row of the global batch."""
    lengths = rng.integers(min_len, WIDTH + 1, BATCH)
    rows = np.repeat(np.arange(BATCH), lengths)
    ids = rng.integers(0, vocab, rows.size)
    ids[:2] = vocab - 1  # a repeated id, also across workers
    weights = rng.uniform(0.5, 2.0, rows.size).astype(np.float32)
    return rows, ids, weights


def global_batch(step: int):
    """One (rows, ids, weights) per table and labels [B, 1]."""
    rng = np.random.default_rng(200 + step)
    features = [sparse_feature(rng, vocab) for _, vocab, _, _, _ in TABLES]
    labels = rng.integers(0, 2, (BATCH, 1)).astype(np.float32)
    return features, labels


def local_rows(rank: int, size: int):
    per = BATCH // size
    return rank * per, (rank + 1) * per


def local_feature(feature, rank: int, size: int):
    rows, ids, weights = feature
    lo, hi = local_rows(rank, size)
    keep = (rows >= lo) & (rows < hi)
    return rows[keep] - lo, ids[keep], weights[keep]


def local_batch(step: int, rank: int, size: int):
    features, labels = global_batch(step)
    lo, hi = local_rows(rank, size)
    return [local_feature(f, rank, size) for f in features], labels[lo:hi]


def sparse_value(rows, values, batch):
    """A ``[batch, WIDTH]`` SparseTensorValue of ``values`` at ``rows`` (sorted), columns from 0 per row."""
    starts = np.searchsorted(rows, rows, side="left")
    cols = np.arange(rows.size) - starts
    return tf.compat.v1.SparseTensorValue(np.stack([rows, cols], 1).astype(np.int64), values, [batch, WIDTH])


def make_tables(strategy=None):
    scope = strategy.embedding_scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        return [tf.compat.v1.get_variable(name, [vocab, dim], initializer=tf.compat.v1.constant_initializer(
            table_values(i, vocab, dim))) for i, (name, vocab, dim, _, _) in enumerate(TABLES)]


def placeholders():
    ids = [tf.compat.v1.sparse_placeholder(tf.int64, [None, WIDTH]) for _ in TABLES]
    weights = [tf.compat.v1.sparse_placeholder(tf.float32, [None, WIDTH]) if t[4] else None for t in TABLES]
    return ids, weights


def feed_dict(ids, weights, features, batch):
    feed = {}
    for sp_ids, sp_w, (rows, values, w) in zip(ids, weights, features):
        feed[sp_ids] = sparse_value(rows, values, batch)
        if sp_w is not None:
            feed[sp_w] = sparse_value(rows, w, batch)
    return feed


def lookups(tables, ids, weights, group_lookup=None):
    """Per-table ``tf.nn.embedding_lookup_sparse``, or ``group_lookup`` over all tables at once."""
    combiners = [t[3] for t in TABLES]
    if group_lookup is not None:
        return group_lookup(tables, ids, weights, combiners)
    return [tf.nn.embedding_lookup_sparse(t, i, w, combiner=c) for t, i, w, c in zip(tables, ids, weights, combiners)]


def weight_gradients(outputs, weights):
    """Gradients of a fixed function of ``outputs`` with respect to each weighted table's weight values."""
    probe = [tf.reshape(tf.cos(tf.cast(tf.range(tf.size(o)), o.dtype)), tf.shape(o)) for o in outputs]
    objective = tf.add_n([tf.reduce_sum(o * p) for o, p in zip(outputs, probe)])
    weighted = [w.values for w in weights if w is not None]
    return dict(zip([i for i, w in enumerate(weights) if w is not None], tf.gradients(objective, weighted)))


def reference_weight_gradients(features, batch):
    """:func:`weight_gradients` in one plain TensorFlow process on whole tables."""
    with tf.Graph().as_default():
        tables = make_tables()
        ids, weights = placeholders()
        grads = weight_gradients(lookups(tables, ids, weights), weights)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return sess.run(grads, feed_dict(ids, weights, features, batch))


def train(batches, strategy=None, group_lookup=None):
    """Adagrad on a small head over all tables; returns losses, tables, head weights."""
    with tf.Graph().as_default():
        tables = make_tables(strategy)
        ids, weights = placeholders()
        labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
        emb = tf.concat(lookups(tables, ids, weights, group_lookup), axis=1)
        width = sum(t[2] for t in TABLES)
        w = tf.compat.v1.get_variable("w", [width, 1], initializer=tf.compat.v1.constant_initializer(
            np.linspace(-0.4, 0.4, width).reshape(-1, 1)))
        logits = tf.matmul(tf.tanh(emb), w)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
        train_op = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            losses = []
            for features, lab in batches:
                feed = feed_dict(ids, weights, features, len(lab))
                feed[labels] = lab
                losses.append(sess.run([loss, train_op], feed)[0])
            return np.array(losses), sess.run(tables), sess.run(w)
