"""One small model and its data, built the same way with and without collective.

The workers build it inside ``CollectiveStrategy`` on their share of each
global batch; the tests build it in plain single-process TensorFlow on the
whole batch and compare.
"""

import contextlib

import numpy as np
import tensorflow as tf

VOCAB, DIM, BATCH, STEPS = 23, 4, 12, 3
SEEDED_PARTITIONS = 3
# The matrix (tests/test_matrix.py) trains every tf.compat.v1.train optimizer on every entry point; here:
# a user's subclass, and "AdamInScope": Adam whose minimize runs inside embedding_scope (its slots must not be
# sharded again). make_optimizer() knows the others too.
OPTIMIZERS = ("UserSubclass", "AdamInScope")


def seeded_partitioned_table() -> np.ndarray:
    """What plain TensorFlow initialises a partitioned table with a seeded random initializer to (one process)."""
    with tf.Graph().as_default():
        var = tf.compat.v1.get_variable(
            "seeded", [VOCAB, DIM], initializer=tf.compat.v1.random_uniform_initializer(seed=11),
            partitioner=tf.compat.v1.fixed_size_partitioner(SEEDED_PARTITIONS))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            return sess.run(var.as_tensor())


def table_values(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 0.5, (VOCAB, DIM)).astype(np.float32)


def global_batch(step: int):
    """Dense ids [B, 2], sparse ids as (rows, ids, weights) with 1-3 ids per row, labels [B, 1]."""
    rng = np.random.default_rng(100 + step)
    dense = rng.integers(0, VOCAB, (BATCH, 2))
    dense[0, :] = 5  # a repeated id across rows and workers
    lengths = rng.integers(1, 4, BATCH)
    rows = np.repeat(np.arange(BATCH), lengths)
    ids = rng.integers(0, VOCAB, rows.size)
    weights = rng.uniform(0.5, 2.0, rows.size).astype(np.float32)
    labels = rng.integers(0, 2, (BATCH, 1)).astype(np.float32)
    return dense, (rows, ids, weights), labels


def local_batch(step: int, rank: int, size: int):
    """Worker ``rank``'s contiguous share of the global batch."""
    dense, (rows, ids, weights), labels = global_batch(step)
    per = BATCH // size
    lo, hi = rank * per, (rank + 1) * per
    keep = (rows >= lo) & (rows < hi)
    return dense[lo:hi], (rows[keep] - lo, ids[keep], weights[keep]), labels[lo:hi]


def make_optimizer(name: str, train=tf.compat.v1.train):
    """The optimizer ``name`` from ``train`` (``tf.compat.v1.train``, or ``hb.train`` for its wrapped ones)."""
    name = name[:-len("InScope")] if name.endswith("InScope") else name
    if name == "GradientDescent":
        return train.GradientDescentOptimizer(0.5)
    if name == "Momentum":
        return train.MomentumOptimizer(0.3, 0.9)
    if name == "Adagrad":
        return train.AdagradOptimizer(0.4)
    if name == "Adam":
        # With the default epsilon (1e-8) Adam turns a gradient that is zero up to rounding (1e-9, whose sign
        # depends on the summation order across workers) into a step of lr/10: epsilon 1e-3 keeps the
        # comparison well-conditioned and leaves the steps of real gradients (1e-2 and up) normalised.
        return train.AdamOptimizer(0.05, epsilon=1e-3)
    if name == "Ftrl":
        return train.FtrlOptimizer(0.3, l1_regularization_strength=0.001)
    if name == "UserSubclass":
        class HalvingSGD(tf.compat.v1.train.GradientDescentOptimizer):
            """A user optimizer: plain SGD whose rate halves, inherited apply_gradients."""

            def __init__(self):
                super().__init__(0.8, name="HalvingSGD")

        return HalvingSGD()
    raise ValueError(name)


def build_training(optimizer_name: str, strategy=None, with_small: bool = False, small_in_scope: bool = False):
    """Builds the model on placeholders; returns (loss, train_op, tables, dense_vars, feed).

    ``with_small`` adds a 2-row table outside ``embedding_scope()`` (the last of ``dense_vars``), or inside it
    with ``small_in_scope`` (where an override can place it).
    """
    def embedding_scope():
        return strategy.embedding_scope() if strategy is not None else contextlib.nullcontext()

    dense_ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
    sp_ids = tf.compat.v1.sparse_placeholder(tf.int64, [None, 3])
    sp_weights = tf.compat.v1.sparse_placeholder(tf.float32, [None, 3])
    labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
    with embedding_scope():
        t1 = tf.compat.v1.get_variable("t1", [VOCAB, DIM], initializer=tf.compat.v1.constant_initializer(
            table_values(1)))
        t2 = tf.compat.v1.get_variable("t2", [VOCAB, DIM], initializer=tf.compat.v1.constant_initializer(
            table_values(2)))
    e1 = tf.reshape(tf.nn.embedding_lookup(t1, dense_ids), [-1, 2 * DIM])
    e2 = tf.nn.embedding_lookup_sparse(t2, sp_ids, sp_weights, combiner="mean")
    inputs = [e1, e2]
    if with_small:
        # A small table a user keeps out of embedding_scope: replicated, with a sparse gradient that workers
        # average by allgather, or by one allreduce of dense sums where that sends less (3 workers: 2 rows < 3).
        small_scope = embedding_scope() if small_in_scope else contextlib.nullcontext()
        with small_scope:
            small = tf.compat.v1.get_variable("small", [2, DIM], initializer=tf.compat.v1.constant_initializer(
                table_values(3)[:2]))
        inputs.append(tf.nn.embedding_lookup(small, dense_ids[:, 0] % 2))
    width = DIM * (len(inputs) + 1)
    w = tf.compat.v1.get_variable("w", [width, 1], initializer=tf.compat.v1.constant_initializer(
        np.linspace(-0.3, 0.3, width).reshape(-1, 1)))
    b = tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.zeros_initializer())
    logits = tf.matmul(tf.nn.relu(tf.concat(inputs, 1)), w) + b
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    in_scope = strategy.embedding_scope() if strategy is not None and optimizer_name.endswith("InScope") \
        else contextlib.nullcontext()
    with in_scope:
        train_op = make_optimizer(optimizer_name).minimize(loss)

    def feed(batch):
        dense, (rows, ids, weights), lab = batch
        return {dense_ids: dense, sp_ids: sparse_value(rows, ids, len(dense)),
                sp_weights: sparse_value(rows, weights, len(dense)), labels: lab}

    return loss, train_op, (t1, t2), (w, b, small) if with_small else (w, b), feed


# Two samples: weights [1, -2] (sum -1) and [1, -1] (sum 0) on every worker.
SIGNED = (np.array([0, 0, 1, 1]), np.array([3, 5, 7, 2]), np.array([1.0, -2.0, 1.0, -1.0], np.float32))


def probe(batch: int) -> np.ndarray:
    """A fixed [batch, DIM] upstream gradient."""
    return (np.arange(batch * DIM, dtype=np.float32).reshape(batch, DIM) % 7 - 3) / 4


def sparse_value(rows, values, batch):
    cols = np.zeros_like(rows)
    for i in range(1, rows.size):
        cols[i] = cols[i - 1] + 1 if rows[i] == rows[i - 1] else 0
    return tf.compat.v1.SparseTensorValue(np.stack([rows, cols], 1).astype(np.int64), values, [batch, 3])


def train(optimizer_name: str, batches, strategy=None, with_small: bool = False, save_to=None,
          small_in_scope: bool = False):
    """Runs the model over ``batches``; returns losses, final tables and dense weights (saved to ``save_to``
    with collective's Saver when given)."""
    with tf.Graph().as_default():
        loss, train_op, tables, dense_vars, feed = build_training(optimizer_name, strategy, with_small,
                                                                  small_in_scope)
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            losses = [sess.run([loss, train_op], feed(batch))[0] for batch in batches]
            if save_to is not None:
                from collective.checkpoint import Saver  # pylint: disable=import-outside-toplevel

                Saver().save(sess, save_to)
            return np.array(losses), sess.run(tables), sess.run(dense_vars)


def restored_tables(optimizer_name: str, strategy, prefix: str):
    """The model's tables (this worker's rows) restored from checkpoint ``prefix`` by collective's Saver."""
    from collective.checkpoint import Saver  # pylint: disable=import-outside-toplevel

    with tf.Graph().as_default():
        _, _, tables, _, _ = build_training(optimizer_name, strategy, with_small=True)
        saver = Saver()
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, prefix)
            return sess.run(tables)
