"""reference/hybridbackend-parallel-training.md, "Work with estimator", run as written.

argv: out_dir parquet_file...

Changes, each marked "CHANGED":
- imports: ``collective.hb`` for ``hybridbackend.tensorflow``; ``tensorflow.compat.v1``
  with TF1 behaviour (TF 1.x code: tf.train.*, tf.placeholder).
- data: ``train_input_fn`` / ``eval_input_fn`` read the Parquet files from argv with
  ``hb.data.ParquetDataset`` (columns a: float, c: int64 id, label), batch_size 4.
- the recipe's ``# ...``: the model of hb_model.py (an id looked up in a
  table made in ``hb.embedding_scope()``, concatenated with a float, a linear
  layer), sigmoid cross entropy; EVAL returns the loss and an AUC, PREDICT the
  logits; ``lr`` is 0.5.
- ``TrainSpec(..., hooks=[...])``: a hook that records each step's loss and batch
  (the test replays the batches in one process).
- ``numeric_fields`` / ``categorical_fields`` are the test's (``a`` is a float, so
  its placeholder is float32); ``export_dir_base`` is under out_dir.
- evident slip: ``estimator.export_saved_model`` -> ``model.export_saved_model``
  (the recipe names its estimator ``model``).
The Estimator is built without ``model_dir``, as in the recipe.
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
numeric_fields, categorical_fields = ["a"], ["c"]  # CHANGED: the test's fields
export_dir_base = os.path.join(out_dir, "export")  # CHANGED


def _input_fn():  # CHANGED: the recipe's train_input_fn / eval_input_fn
  ds = hb.data.ParquetDataset(files, batch_size=4)
  return ds.map(lambda batch: (batch, batch.pop("label")))


train_input_fn = eval_input_fn = _input_fn


def _logits(features):  # CHANGED: the recipe's "# ..." (hb_model)
  logits, _, _ = logits_and_variables(features)
  tf.add_to_collection("recipe_batch", (features["a"], features["c"]))
  return logits


def model_fn(features, labels, mode, params):
  # ...
  logits = _logits(features)  # CHANGED: the recipe's "# ..."
  if mode != tf.estimator.ModeKeys.PREDICT:
    labels = tf.reshape(tf.cast(labels, tf.float32), [-1, 1])
    loss = tf.losses.sigmoid_cross_entropy(labels, logits)
  if mode == tf.estimator.ModeKeys.TRAIN:
    tf.add_to_collection("recipe_batch", labels)
    opt = hb.train.AdagradOptimizer(learning_rate=lr)
    train_op = opt.minimize(loss)
    step = tf.train.get_or_create_global_step()
    train_op = opt.minimize(loss, global_step=step)
    return hb.estimator.EstimatorSpec(
        mode=tf.estimator.ModeKeys.TRAIN,
        loss=loss,
        train_op=train_op)
  if mode == tf.estimator.ModeKeys.EVAL:
    # Parallel evaluation is enabled by default.
    # ...
    return hb.estimator.EstimatorSpec(  # CHANGED: the recipe's "# ..."
        mode=mode, loss=loss, eval_metric_ops={"auc": tf.metrics.auc(labels, tf.sigmoid(logits))})
  if mode == tf.estimator.ModeKeys.PREDICT:
    # ...
    return hb.estimator.EstimatorSpec(mode=mode, predictions={"logits": logits})  # CHANGED: "# ..."


class RecordBatches(tf.train.SessionRunHook):  # CHANGED: records each step's loss and batch
  def __init__(self):
    self.steps = []

  def before_run(self, run_context):
    (a, c), labels = tf.get_collection("recipe_batch")
    return tf.train.SessionRunArgs([a, c, labels])

  def after_run(self, run_context, run_values):
    self.steps.append(run_values.results)


recorder = RecordBatches()  # CHANGED

model = hb.estimator.Estimator(model_fn=model_fn)
train_spec = tf.estimator.TrainSpec(input_fn=train_input_fn, hooks=[recorder])  # CHANGED: hooks
eval_spec = tf.estimator.EvalSpec(input_fn=eval_input_fn)

# Train and evaluate the estimator.
result, _ = hb.estimator.train_and_evaluate(model, train_spec, eval_spec)  # CHANGED: keeps the metrics

def _on_export():
  inputs = {}
  for f in numeric_fields:
    inputs[f] = tf.placeholder(dtype=tf.float32, shape=[None], name=f)  # CHANGED: float field
  for f in categorical_fields:
    # Feed sparse placeholders using `tf.SparseTensorValue`
    inputs[f] = tf.sparse_placeholder(dtype=tf.int64, name=f)
  return tf.estimator.export.ServingInputReceiver(inputs, inputs)

model.export_saved_model(export_dir_base, _on_export)  # CHANGED: slip estimator -> model

# Not in the recipe: what the test compares (the checkpoint holds the whole table).
table, w = model.get_variable_value("c_table"), model.get_variable_value("w")
np.savez(os.path.join(out_dir, f"rank{hb.context.rank}.npz"), table=table, w=w, model_dir=model.model_dir,
         eval_loss=result["loss"], eval_auc=result["auc"], steps=len(recorder.steps),
         **{f"{k}{i}": v for i, s in enumerate(recorder.steps) for k, v in zip(("a", "c", "label"), s)})
