"""Canned estimators through strategy.estimator, a canned model_fn in embedding_scope() (refused), and warm starts
of sharded tables; writes rank<r>.npz. argv: out_dir initial_checkpoints_dir warm_checkpoint."""

import os
import sys

import numpy as np
import tensorflow as tf

import canned_cases as cases
from collective import CollectiveStrategy

out_dir, initial_dir, warm_checkpoint = sys.argv[1:4]
strategy = CollectiveStrategy("hb")
r, n = strategy.rank(), strategy.world_size()
results = {}
estimators = {}

for name in cases.NAMES:
    model_dir = os.path.join(out_dir, name)
    estimator = cases.canned(name, os.path.join(out_dir, "unused", f"{name}{r}"))
    collective = strategy.estimator(cases.starting_from(estimator, os.path.join(initial_dir, name, "initial",
                                                                                "model.ckpt")), model_dir)
    collective.train(cases.train_input_fn(r, n), max_steps=cases.STEPS)
    exported = collective.export_saved_model(os.path.join(model_dir, "export"), cases.serving_input_receiver_fn)
    if r == 0:
        results[f"{name}/export"] = np.array(exported.decode())
    estimators[name] = collective

# A canned model_fn inside embedding_scope() is refused at graph build, saying how to use it.
refused = strategy.estimator(cases.in_embedding_scope(strategy, cases.canned("dnn", None)),
                             os.path.join(out_dir, "refused"))
try:
    refused.train(cases.train_input_fn(r, n), max_steps=1)
except TypeError as err:
    results["refusal"] = np.array(str(err))

# Warm starts of sharded tables: scope and one-to-one mappings, tf.compat.v1.train.warm_start.
with strategy.scope(), tf.Graph().as_default():
    with strategy.embedding_scope():
        tables = {name: tf.compat.v1.get_variable(name, [cases.VOCAB, cases.EMB_DIM]) for name in cases.WARM}
    tf.compat.v1.train.init_from_checkpoint(warm_checkpoint, {"ws/": "ws/"})
    tf.compat.v1.train.init_from_checkpoint(warm_checkpoint, {"ws3/t3": tables["ws3/t3"]})
    tf.compat.v1.train.warm_start(warm_checkpoint, vars_to_warm_start="ws4/.*")
    with strategy.embedding_scope():
        wider = tf.compat.v1.get_variable("wider", [cases.VOCAB + 1, cases.EMB_DIM])
    try:
        tf.compat.v1.train.init_from_checkpoint(warm_checkpoint, {"ws/t1": wider})
    except ValueError as err:
        results["warm_refusal"] = np.array(str(err))
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for name, table in tables.items():
            results[f"warm/{name}"] = sess.run(table)

# Estimator's warm_start_from through strategy.estimator.
warm_estimator = strategy.estimator(
    cases.warm_table_model_fn(strategy), os.path.join(out_dir, "warm_estimator"),
    warm_start_from=tf.estimator.WarmStartSettings(warm_checkpoint, vars_to_warm_start="ws/.*"))
warm_estimator.train(cases.train_input_fn(r, n), max_steps=1)

np.savez(os.path.join(out_dir, f"rank{r}.npz"), **results)

# Evaluation last: until Keras metrics are reduced by identity (issue 41, defect 1) it fails on every worker.
for name, collective in estimators.items():
    try:
        for key, value in collective.evaluate(cases.eval_input_fn(r, n)).items():
            results[f"{name}/eval/{key}"] = value
    except tf.errors.OpError as err:
        results[f"{name}/eval_error"] = np.array(str(err).splitlines()[0])
    np.savez(os.path.join(out_dir, f"rank{r}.npz"), **results)
