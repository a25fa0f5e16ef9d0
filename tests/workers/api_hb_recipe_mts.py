"""reference/hybridbackend-parallel-training.md, "Work with MonitoredTrainingSession", run as written.

argv: out_dir parquet_file...

Changes, each marked "CHANGED":
- imports: ``collective.hb`` for ``hybridbackend.tensorflow``; ``tensorflow.compat.v1``
  with eager execution disabled (TF1 code: tf.losses, tf.train.*).
- data: the Parquet files from argv (columns a: float, c: int64 id, label), batch_size 4.
- the recipe's ``# ...`` model: ``c`` looked up in a 20 x 4 table made in
  ``hb.embedding_scope()``, concatenated with ``a``, a linear layer, sigmoid cross
  entropy; fixed initial values. The eval dataset/metrics (``...`` in the recipe)
  and the export section are left out (export is tested with collective.export).
- ``hooks=[...]``: a hook that saves the trained values when the session ends;
  each step also fetches the loss and the batch (the test replays the batches).
"""
import os
import sys

import numpy as np
import tensorflow.compat.v1 as tf  # CHANGED: TF1 API

tf.disable_eager_execution()  # CHANGED

import collective.hb as hb  # CHANGED: import

out_dir, files = sys.argv[1], sys.argv[2:]
lr = 0.5
VOCAB, DIM = 20, 4
TABLE = np.random.default_rng(3).normal(0, 0.5, (VOCAB, DIM)).astype(np.float32)
W = np.linspace(-0.5, 0.5, DIM + 1).reshape(-1, 1).astype(np.float32)


def my_model(features):  # CHANGED: the recipe's "# ..."
    with hb.embedding_scope():
        table = tf.get_variable("c_table", [VOCAB, DIM], initializer=tf.constant_initializer(TABLE))
        emb = tf.nn.embedding_lookup(table, features["c"])
    w = tf.get_variable("w", [DIM + 1, 1], initializer=tf.constant_initializer(W))
    x = tf.concat([emb, tf.cast(features["a"], tf.float32)[:, None]], axis=1)
    logits = tf.matmul(x, w)
    tf.losses.sigmoid_cross_entropy(tf.cast(features["label"], tf.float32)[:, None], logits)
    return table, w


class SaveOnEnd(tf.train.SessionRunHook):  # CHANGED: records the trained values
    def __init__(self, fetches):
        self.fetches = fetches

    def end(self, session):
        table, w = session.run(self.fetches)
        np.savez(os.path.join(out_dir, f"final{hb.context.rank}.npz"), table=table, w=w)


# Place graph on specific GPU.
with tf.device(hb.train.device_setter()):
  # Read from a parquet file.
  with tf.device('/cpu:0'):
    train_ds = hb.data.ParquetDataset(
        files,  # CHANGED: data
        batch_size=4)  # CHANGED: 1024
    train_ds = train_ds.prefetch(4)
  train_it = hb.data.make_iterator(train_ds)
  train_features = train_it.get_next()
  # {'a': tensora, 'c': tensorc}
  table, w = my_model(train_features)  # CHANGED
  loss = tf.losses.get_total_loss()
  # Use auto-generated wrapper for predefined optimizer.
  opt = hb.train.GradientDescentOptimizer(learning_rate=lr)
  train_op = opt.minimize(loss)

# Create a server by reading cluster information in `hb.context`.
server = hb.train.Server()

steps = []
# All workers must be chief to initialize variables.
with hb.train.MonitoredTrainingSession(
    server.target,
    is_chief=True,
    hooks=[SaveOnEnd([table, w])]) as sess:  # CHANGED
  while not sess.should_stop():
    _, loss_v, batch = sess.run([train_op, loss, train_features])  # CHANGED: also the loss and batch
    steps.append((loss_v, batch))

np.savez(os.path.join(out_dir, f"rank{hb.context.rank}.npz"), losses=np.array([s[0] for s in steps]),
         **{f"{k}{i}": s[1][k] for i, s in enumerate(steps) for k in ("a", "c", "label")})
