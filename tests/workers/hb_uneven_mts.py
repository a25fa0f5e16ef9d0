"""HybridBackend's loop (hb.data.make_iterator + hb.train.MonitoredTrainingSession) on unequal shares.

argv: out_dir. Rank r trains on 10 - 3r batches; every rank must stop after the longest share.
Writes rank<r>.npz: steps run, the table shard and w at the end.
"""

import os
import sys

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_eager_execution()

import collective.hb as hb  # noqa: E402
import uneven_cases as cases  # noqa: E402
from collective import comm  # noqa: E402

out_dir = sys.argv[1]
r = comm.rank()
results = {}


class Capture(tf.train.SessionRunHook):
    def __init__(self, fetch):
        self.fetch = fetch

    def end(self, session):
        results.update(session.run(self.fetch))


with hb.scope():
    ids, targets = cases.worker_data(r)
    ds = tf.data.Dataset.from_tensor_slices({"ids": ids, "y": targets}).batch(cases.BATCH)
    features = hb.data.make_iterator(ds).get_next()
    loss, table, w = cases.model(features["ids"], features["y"], hb.embedding_scope)
    train_op = hb.train.GradientDescentOptimizer(cases.LR).minimize(
        loss, global_step=tf.train.get_or_create_global_step())
    steps = 0
    with hb.train.MonitoredTrainingSession(hooks=[Capture({"table": table, "w": w})]) as sess:
        while not sess.should_stop():
            sess.run(train_op)
            steps += 1
results["steps"] = np.array(steps)
np.savez(os.path.join(out_dir, f"rank{r}.npz"), **results)
