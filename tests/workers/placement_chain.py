"""One stage of a checkpoint's trip across placements and worker counts (issue 43).

argv: stage backend tf1|tf2 prefix_in|- prefix_out t_placement u_placement (``COLLECTIVE_PACKING`` as the
launch sets it: t and u share one packing group when both are row-wise under hb)

Restores ``prefix_in`` (``-``: starts from the initial values), trains
:data:`STEPS` steps of the model below (two tables under the given
placements, Adagrad: every variable has a slot) on this worker's share of
each global batch, and saves ``prefix_out`` with collective's Saver. The
test compares each stage's checkpoint (the logical tables and slots, read
with ``tf.train.load_variable``) with one process trained as many steps.
"""

import os
import sys

import numpy as np
import tensorflow as tf

if __name__ == "__main__" and sys.argv[3] == "tf1":
    tf.compat.v1.disable_v2_behavior()

from collective import CollectiveStrategy  # noqa: E402  pylint: disable=wrong-import-position
from collective.checkpoint import Saver  # noqa: E402  pylint: disable=wrong-import-position

# One dim: row-wise under hb with COLLECTIVE_PACKING=1, t and u share one packing group (docs/packing.md).
T_SHAPE, U_SHAPE, BATCH, STEPS = (7, 5), (5, 5), 6, 2


def global_batch(step: int):
    """Dense ids of ``t`` [B, 2], sparse ids of ``u`` as (rows, ids) with 1-2 ids per row, labels [B, 1]."""
    rng = np.random.default_rng(700 + step)
    lengths = rng.integers(1, 3, BATCH)
    rows = np.repeat(np.arange(BATCH), lengths)
    return (rng.integers(0, T_SHAPE[0], (BATCH, 2)), (rows, rng.integers(0, U_SHAPE[0], rows.size)),
            rng.integers(0, 2, (BATCH, 1)).astype(np.float32))


def local_batch(step: int, rank: int, size: int):
    dense, (rows, ids), labels = global_batch(step)
    per = BATCH // size
    keep = (rows >= rank * per) & (rows < (rank + 1) * per)
    return dense[rank * per:(rank + 1) * per], (rows[keep] - rank * per, ids[keep]), \
        labels[rank * per:(rank + 1) * per]


def build(strategy=None):
    """The model on placeholders: (loss, train_op, feed)."""
    scope = strategy.embedding_scope() if strategy is not None else tf.compat.v1.variable_scope("")
    dense_ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
    sp_ids = tf.compat.v1.sparse_placeholder(tf.int64, [None, 2])
    labels = tf.compat.v1.placeholder(tf.float32, [None, 1])
    with scope:
        t = tf.compat.v1.get_variable("t", T_SHAPE, initializer=tf.compat.v1.constant_initializer(
            np.random.default_rng(1).normal(0, 0.5, T_SHAPE).astype(np.float32)))
        u = tf.compat.v1.get_variable("u", U_SHAPE, initializer=tf.compat.v1.constant_initializer(
            np.random.default_rng(2).normal(0, 0.5, U_SHAPE).astype(np.float32)))
    features = tf.concat([tf.reshape(tf.nn.embedding_lookup(t, dense_ids), [-1, 2 * T_SHAPE[1]]),
                          tf.nn.embedding_lookup_sparse(u, sp_ids, None, combiner="mean")], axis=1)
    width = 2 * T_SHAPE[1] + U_SHAPE[1]
    w = tf.compat.v1.get_variable("w", [width, 1], initializer=tf.compat.v1.constant_initializer(
        np.linspace(-0.4, 0.4, width).reshape(-1, 1)))
    logits = tf.matmul(tf.tanh(features), w)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    train_op = tf.compat.v1.train.AdagradOptimizer(0.3).minimize(loss)

    def feed(batch):
        dense, (rows, ids), lab = batch
        cols = np.concatenate([np.arange(np.sum(rows == r)) for r in range(len(dense))]).astype(np.int64)
        value = tf.compat.v1.SparseTensorValue(np.stack([rows, cols], 1).astype(np.int64), ids, [len(dense), 2])
        return {dense_ids: dense, sp_ids: value, labels: lab}

    return loss, train_op, feed


KEYS = ("t", "u", "w", "t/Adagrad", "u/Adagrad", "w/Adagrad")


def reference(stages: int):
    """One plain process's variables and Adagrad slots (:data:`KEYS`) after each of ``stages`` stages' steps."""
    with tf.Graph().as_default():
        _, train_op, feed = build()
        variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            after = []
            for step in range(stages * STEPS):
                sess.run(train_op, feed(global_batch(step)))
                if (step + 1) % STEPS == 0:
                    after.append(sess.run({key: variables[key] for key in KEYS}))
            return after


def main(stage, backend, prefix_in, prefix_out, t_placement, u_placement):
    strategy = CollectiveStrategy(backend, sharding={"t": t_placement, "u": u_placement})
    r, n = strategy.rank(), strategy.world_size()
    first = int(stage) * STEPS
    with strategy.scope(), tf.Graph().as_default():
        _, train_op, feed = build(strategy)
        saver = Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            if prefix_in != "-":
                saver.restore(sess, prefix_in)
            for step in range(first, first + STEPS):
                sess.run(train_op, feed(local_batch(step, r, n)))
            saver.save(sess, prefix_out)
        assert [strategy.plan[name].placement for name in ("t", "u")] == [t_placement, u_placement]
        packs = os.environ.get("COLLECTIVE_PACKING") == "1" and backend == "hb"
        row_wise = [placement == "row_wise" for placement in (t_placement, u_placement)]
        group = "collective_packed/" + ("t" if row_wise[0] else "u")  # the first row-wise table's: t and u share it
        assert [strategy.plan[name].packing_group for name in ("t", "u")] == [group if packs and r else ""
                                                                             for r in row_wise]
    import host_probe  # pylint: disable=import-outside-toplevel  (a script's neighbour; tests import this module)

    host_probe.record_exchange()  # tests/test_hosts.py: the route of a TF1 job on several hosts


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *sys.argv[4:8])
