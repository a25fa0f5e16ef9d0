"""derived_cases on N workers: train, save with a user's Saver, restore EMA weights with another, export.

argv: out_dir, a checkpoint to restore the EMA weights from ("-": this run's), "tf1" or "tf2".
Writes <out>/rank<r>.npz: ``ema_logits`` (the logits of every id after the restore), ``shadow_rows`` (this
worker's rows of the table's EMA shadow, after resuming the checkpoint to restore from) and ``exported``; the
checkpoint under <out>/model and rank 0's export under <out>/export.
"""

import os
import sys

import numpy as np
import tensorflow as tf

import derived_cases as cases
from collective import CollectiveStrategy
from collective.integration.export import export_estimator

out, restore_from, behaviour = sys.argv[1], sys.argv[2], sys.argv[3]
if behaviour == "tf1":
    tf.compat.v1.disable_v2_behavior()
os.makedirs(os.path.join(out, "model"), exist_ok=True)
strategy = CollectiveStrategy("hb")
r, n = strategy.rank(), strategy.world_size()
with strategy.scope():
    with tf.Graph().as_default():
        train_op, ids, labels, shadow = cases.build_training(strategy)
        saver = tf.compat.v1.train.Saver()  # a user's own Saver, every variable
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            for step in range(cases.STEPS):
                batch_ids, batch_labels = cases.local_batch(step, r, n)
                sess.run(train_op, {ids: batch_ids, labels: batch_labels})
            checkpoint = saver.save(sess, os.path.join(out, "model", "model.ckpt"))
            if restore_from != "-":  # resume another number of workers' checkpoint: this worker's shadow rows
                saver.restore(sess, restore_from)
            shadow_rows = sess.run(shadow)
    with tf.Graph().as_default():
        features = {"ids": tf.constant(cases.SERVE_IDS)}
        spec = cases.serving_model_fn(strategy)(features, tf.estimator.ModeKeys.PREDICT)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.local_variables_initializer())
            spec.scaffold.saver.restore(sess, checkpoint if restore_from == "-" else restore_from)
            ema_rows = sess.run(spec.predictions["logits"])
    exported = export_estimator(cases.serving_model_fn(strategy), None, None, os.path.join(out, "export"),
                                cases.serving_input_receiver_fn, checkpoint)
np.savez(os.path.join(out, f"rank{r}.npz"), ema_logits=ema_rows, shadow_rows=shadow_rows,
         exported=np.array(exported.decode() if exported else ""))
