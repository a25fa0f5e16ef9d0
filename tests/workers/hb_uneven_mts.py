"""HybridBackend's loop (hb.data.make_iterator + hb.train.MonitoredTrainingSession) on unequal shares.

argv: out_dir. Rank r trains on 10 - 3r batches; every rank must stop after the longest share.
Writes rank<r>.npz: steps run, the table shard and w at the end; then, on the same shares, a model
with batch norms (estimator_cases.batch_norm_layers) on the ids as floats: bn/<variable> at the end.
"""

import os
import sys

import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_eager_execution()

import collective.hb as hb  # noqa: E402
import estimator_cases  # noqa: E402
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


def features_of_share():
    ids, targets = cases.worker_data(r)
    ds = tf.data.Dataset.from_tensor_slices({"ids": ids, "y": targets}).batch(cases.BATCH)
    return hb.data.make_iterator(ds).get_next()


def train(train_op, fetch) -> int:
    steps = 0
    with hb.train.MonitoredTrainingSession(hooks=[Capture(fetch)]) as sess:
        while not sess.should_stop():
            sess.run(train_op)
            steps += 1
    return steps


with hb.scope():
    features = features_of_share()
    loss, table, w = cases.model(features["ids"], features["y"], hb.embedding_scope)
    train_op = hb.train.GradientDescentOptimizer(cases.LR).minimize(
        loss, global_step=tf.train.get_or_create_global_step())
    results["steps"] = np.array(train(train_op, {"table": table, "w": w}))

    # Batch norm: rank 1's empty steps must leave its moving statistics alone and no weight NaN.
    with tf.Graph().as_default():
        features = features_of_share()
        apply, keras_bn = estimator_cases.batch_norm_layers(2)
        fused, plain = apply(tf.cast(features["ids"], tf.float32))
        loss = tf.losses.mean_squared_error(features["y"], tf.reduce_sum(fused + plain, 1, keepdims=True))
        with tf.control_dependencies(tf.get_collection(tf.GraphKeys.UPDATE_OPS) + list(keras_bn.updates)):
            train_op = hb.train.GradientDescentOptimizer(cases.LR).minimize(
                loss, global_step=tf.train.get_or_create_global_step())
        fetch = {f"bn/{v.op.name}": v for v in tf.global_variables() if v.op.name.startswith("bn_")}
        results["bn/steps"] = np.array(train(train_op, fetch))
np.savez(os.path.join(out_dir, f"rank{r}.npz"), **results)
