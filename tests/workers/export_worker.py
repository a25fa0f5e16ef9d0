"""Trains, predicts with the sharded model and exports a SavedModel (both entry points), both backends (sok's
tables column_wise, hb's row_wise).

argv: base_dir. Writes <base>/<backend>/rank<r>.npz (this rank's logits on its
rows of checkpoint_cases.serving_inputs(), and what export returned) and the
exports under <base>/<backend>/export and <base>/<backend>/export_estimator.
"""

import os
import sys

import numpy as np
import tensorflow as tf

import checkpoint_cases
import embedding_cases as cases
from collective import CollectiveStrategy
from collective.checkpoint import Saver
from collective.integration.export import export_estimator

base = sys.argv[1]


def placeholders():
    return {"ids": tf.compat.v1.placeholder(tf.int64, [None, 2], name="ids"),
            "sp": tf.compat.v1.placeholder(tf.int64, [None, 3], name="sp"),
            "weights": tf.compat.v1.placeholder(tf.float32, [None, 3], name="weights")}


# sok's tables are placed column_wise (issue 43): its export serves what the column-wise workers predict.
SHARDING = {"hb": None, "sok": {"t1": "column_wise", "t2": "column_wise"}}

for backend in ("hb", "sok"):
    strategy = CollectiveStrategy(backend, sharding=SHARDING[backend])
    r, n = strategy.rank(), strategy.world_size()
    out = os.path.join(base, backend)
    with strategy.scope():
        with tf.Graph().as_default():
            _, train, feed = checkpoint_cases.build(strategy)
            saver = Saver()
            with tf.compat.v1.Session() as sess:
                sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
                for step in range(2):
                    sess.run(train, feed(cases.local_batch(step, r, n)))
                checkpoint = saver.save(sess, os.path.join(out, "model", "model.ckpt"), global_step=2)
        # The distributed model predicts this worker's rows of the serving batch.
        inputs = checkpoint_cases.serving_inputs()
        rows = len(inputs["ids"]) // n
        mine = {k: v[r * rows:(r + 1) * rows] for k, v in inputs.items()}
        with tf.Graph().as_default():
            ph = placeholders()
            logits = checkpoint_cases.forward(ph["ids"], ph["sp"], ph["weights"], strategy)
            with tf.compat.v1.Session() as sess:
                Saver().restore(sess, checkpoint)
                sess.run(tf.compat.v1.local_variables_initializer())
                local_logits = sess.run(logits, {ph[k]: v for k, v in mine.items()})

        def signature_def_fn():
            ph = placeholders()
            return tf.compat.v1.saved_model.predict_signature_def(
                ph, {"logits": checkpoint_cases.forward(ph["ids"], ph["sp"], ph["weights"], strategy)})

        def model_fn(features, mode):
            logits = checkpoint_cases.forward(features["ids"], features["sp"], features["weights"], strategy)
            return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})

        def serving_input_receiver_fn():
            ph = placeholders()
            return tf.estimator.export.ServingInputReceiver(ph, ph)

        exported = strategy.export_saved_model(os.path.join(out, "export"), checkpoint, signature_def_fn)
        exported_estimator = export_estimator(model_fn, None, None, os.path.join(out, "export_estimator"),
                                              serving_input_receiver_fn, os.path.dirname(checkpoint))
    np.savez(os.path.join(out, f"rank{r}.npz"), logits=local_logits,
             placements=np.array([strategy.plan[t].placement for t in ("t1", "t2")]),
             exported=np.array(exported.decode() if exported else ""),
             exported_estimator=np.array(exported_estimator.decode() if exported_estimator else ""))


# A hash-table vocabulary (sok): the export maps keys to rows with a tf.lookup table; unseen keys read zeros.
from collective.embedding.hash_table import inference  # noqa: E402  pylint: disable=wrong-import-position

strategy = CollectiveStrategy("sok")
r, n = strategy.rank(), strategy.world_size()
out = os.path.join(base, "sok-hash")
serving_keys = np.concatenate([checkpoint_cases.hash_batch(0)[0], [[123456789, 3], [-7, -5]]])  # unseen keys too
with strategy.scope():
    with tf.Graph().as_default():
        train, feed = checkpoint_cases.build_hash(strategy)
        saver = Saver()
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            for step in range(2):
                sess.run(train, feed(step, r, n))
            checkpoint = saver.save(sess, os.path.join(out, "model", "model.ckpt"), global_step=2)
    rows = len(serving_keys) // n
    with tf.Graph().as_default(), inference():
        keys = tf.compat.v1.placeholder(tf.int64, [None, 2])
        prediction = checkpoint_cases.hash_forward(keys, strategy)
        with tf.compat.v1.Session() as sess:
            Saver().restore(sess, checkpoint)
            sess.run(tf.compat.v1.local_variables_initializer())
            local_prediction = sess.run(prediction, {keys: serving_keys[r * rows:(r + 1) * rows]})

    def hash_signature_def_fn():
        keys = tf.compat.v1.placeholder(tf.int64, [None, 2], name="keys")
        return tf.compat.v1.saved_model.predict_signature_def(
            {"keys": keys}, {"prediction": checkpoint_cases.hash_forward(keys, strategy)})

    exported = strategy.export_saved_model(os.path.join(out, "export"), checkpoint, hash_signature_def_fn)
np.savez(os.path.join(out, f"rank{r}.npz"), prediction=local_prediction, keys=serving_keys,
         exported=np.array(exported.decode() if exported else ""))
