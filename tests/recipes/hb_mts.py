"""reference/hybridbackend-parallel-training.md, "Work with MonitoredTrainingSession", run as written.

argv: out_dir parquet_file...

Changes, each marked "CHANGED":
- imports: ``collective.hb`` for ``hybridbackend.tensorflow``; ``tensorflow.compat.v1``
  with TF1 behaviour (TF 1.x code: tf.losses, tf.train.*).
- data: the Parquet files from argv (columns a: float, c: int64 id, label), batch_size 4.
- the recipe's ``# ...`` model (hb_model.py): ``c`` looked up in a 20 x 4 table made in
  ``hb.embedding_scope()``, concatenated with ``a``, a linear layer, sigmoid cross
  entropy; fixed initial values. The eval dataset/metrics (``...`` in the recipe)
  are left out.
- MonitoredTrainingSession gets ``checkpoint_dir`` (the recipe's export reads
  ``tf.train.latest_checkpoint(checkpoint_dir)`` but never writes one), so ``minimize``
  gets a global step (TensorFlow's checkpoint hook requires one); in
  ``_on_export`` the numeric field is a float (the test's data) and the model
  returns ``{"logits": ...}`` (``predict_signature_def`` takes dicts).
- ``hooks=[...]``: a hook that saves the trained values when the session ends;
  each step also fetches the loss and the batch (the test replays the batches).
"""
import os
import sys

import numpy as np
import tensorflow.compat.v1 as tf  # CHANGED: TF1 API

tf.disable_v2_behavior()  # CHANGED: TF 1.x behaviour (graphs, ref variables)

import collective.hb as hb  # CHANGED: import
from hb_model import logits_and_variables  # CHANGED: the model of the recipe's "# ..."

out_dir, files = sys.argv[1], sys.argv[2:]
lr = 0.5


def my_model(features, training=True):  # CHANGED: the recipe's "# ..." (hb_model)
  logits, table, w = logits_and_variables(features)
  if not training:
    return {"logits": logits}
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
  train_op = opt.minimize(loss, global_step=tf.train.get_or_create_global_step())  # CHANGED: checkpoints need a step

# Create a server by reading cluster information in `hb.context`.
server = hb.train.Server()

steps = []
checkpoint_dir = os.path.join(out_dir, "ckpt")  # CHANGED
# All workers must be chief to initialize variables.
with hb.train.MonitoredTrainingSession(
    server.target,
    is_chief=True,
    checkpoint_dir=checkpoint_dir,  # CHANGED: written, so that the export below has a checkpoint
    hooks=[SaveOnEnd([table, w])]) as sess:  # CHANGED
  while not sess.should_stop():
    _, loss_v, batch = sess.run([train_op, loss, train_features])  # CHANGED: also the loss and batch
    steps.append((loss_v, batch))

np.savez(os.path.join(out_dir, f"rank{hb.context.rank}.npz"), losses=np.array([s[0] for s in steps]),
         **{f"{k}{i}": s[1][k] for i, s in enumerate(steps) for k in ("a", "c", "label")})

numeric_fields, categorical_fields = ["a"], ["c"]  # CHANGED: the test's fields
export_dir_base = os.path.join(out_dir, "export")  # CHANGED


# Export trained models.
def _on_export():
  example_spec = {}
  for f in numeric_fields:
    example_spec[f] = tf.io.FixedLenFeature([1], dtype=tf.float32)  # CHANGED: float field
  for f in categorical_fields:
    example_spec[f] = tf.io.VarLenFeature(dtype=tf.int64)

  serialized_examples = tf.placeholder(
      dtype=tf.string,
      shape=[None],
      name='input')
  inputs = tf.io.parse_example(serialized_examples, example_spec)

  outputs = my_model(inputs, training=False)
  return tf.saved_model.predict_signature_def(inputs, outputs)

checkpoint_path = tf.train.latest_checkpoint(checkpoint_dir)
hb.saved_model.export(export_dir_base, checkpoint_path, _on_export)
