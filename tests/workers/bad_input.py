"""Lookups with bad or empty input on one worker. argv: mode backend (mode: negative, too_large, empty).

``empty`` also agrees on the sharding plan: rank 0 logs it, and a rank that made another table is refused.
"""

import logging
import sys

import numpy as np
import tensorflow as tf

from collective import CollectiveStrategy
from collective.sharding.runtime import PlanMismatchError

mode, backend = sys.argv[1], sys.argv[2]
strategy = CollectiveStrategy(backend)
r = strategy.rank()
ids = np.array([1, 2, 3], np.int64)
if r == strategy.world_size() - 1:
    ids = {"negative": np.array([1, -3], np.int64), "too_large": np.array([4, 10], np.int64),
           "empty": np.zeros([0], np.int64)}[mode]
with strategy.scope(), tf.Graph().as_default():
    with strategy.embedding_scope():
        table = tf.compat.v1.get_variable("user_table", [10, 2], initializer=tf.compat.v1.ones_initializer())
    ph = tf.compat.v1.placeholder(tf.int64, [None])
    dense = tf.nn.embedding_lookup(table, ph)
    sp = tf.SparseTensor(tf.stack([tf.range(tf.size(ph, out_type=tf.int64)), tf.zeros_like(ph)], 1), ph,
                         [tf.size(ph, out_type=tf.int64), 1])
    combined = tf.nn.embedding_lookup_sparse(table, sp, None, combiner="sum")
    with tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
        d, c = sess.run([dense, combined], {ph: ids})
print(f"rank {r} dense {d.shape} sparse {c.shape} sum {d.sum():.1f}")

if mode == "empty":
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("collective.sharding").setLevel(logging.INFO)
    strategy.announce_plan()
    other = CollectiveStrategy(backend)
    with other.scope(), tf.Graph().as_default(), other.embedding_scope():
        tf.compat.v1.get_variable("same", [6, 2])
        if r == strategy.world_size() - 1:
            tf.compat.v1.get_variable("only_here", [6, 2])
    try:
        other.announce_plan()
        print(f"rank {r} agrees")
    except PlanMismatchError as err:
        print(f"rank {r} refused: {err}")
