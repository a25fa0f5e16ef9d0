"""strategy.estimator train / evaluate / predict / train_and_evaluate, incremental checkpoints, and
ThroughputHook under MonitoredTrainingSession; writes rank<r>.npz.

argv: out_dir backend previous_out_dir|-

Incremental checkpoints (Adagrad, no full saves by config): ``inc`` trains 2
steps with ``incremental_save_steps=1`` (a full checkpoint at step 1, a
delta at 2), then 2 more in a second ``train`` call that resumes from the
chain (deltas 3 and 4), then evaluates the chain end. With a previous
launch's folder (another worker count), ``resume`` copies its ``inc`` model_dir and
trains one more step with DeepRec's recipe, an incremental hook among the
``training_chief_hooks``, recording the variables right after the restore.
"""

import logging
import os
import shutil
import sys

import numpy as np
import tensorflow as tf

import estimator_cases as cases
from collective import CollectiveStrategy, comm
from collective.integration.hooks import ThroughputHook
from collective.integration.incremental import IncrementalSaverHook

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
out_dir, backend, previous = sys.argv[1], sys.argv[2], sys.argv[3]
strategy = CollectiveStrategy(backend)
r, n = strategy.rank(), strategy.world_size()
results = {}


class CaptureHook(tf.compat.v1.train.SessionRunHook):
    """Reads the model's variables (this worker's table shard among them) when training ends.

    With ``at_start`` also right after the session is created (restored), as ``<prefix>_start/<name>``.
    """

    def __init__(self, prefix, extra=(), at_start=False):
        self.prefix, self.at_start = prefix, at_start
        self.names = ("table", "w", "b", "global_step") + tuple(extra)

    def begin(self):
        self.fetch = {v.op.name: v for v in tf.compat.v1.global_variables() if v.op.name in self.names}

    def after_create_session(self, session, coord):
        if self.at_start:
            for name, value in session.run(self.fetch).items():
                results[f"{self.prefix}_start/{name}"] = value

    def end(self, session):
        for name, value in session.run(self.fetch).items():
            results[f"{self.prefix}/{name}"] = value


def input_fn(batches):
    return lambda: cases.dataset(batches)


def save_eval(prefix, metrics):
    for key, value in metrics.items():
        results[f"{prefix}/{key}"] = np.asarray(value)


config = tf.estimator.RunConfig(save_checkpoints_steps=2, log_step_count_steps=1)
with strategy.scope(), tf.Graph().as_default():
    # Even shares, run to the end of the input; then global evaluation and per-worker prediction.
    est = strategy.estimator(cases.make_model_fn(strategy), os.path.join(out_dir, "even"), config=config)
    throughput = ThroughputHook(every_n_steps=1, global_batch_size=cases.GLOBAL_BATCH)
    est.train(input_fn(cases.even_batches(r, n)), hooks=[CaptureHook("even"), throughput])
    results["even/records_steps"] = np.array([rec["step"] for rec in throughput.records])
    results["even/records_samples"] = np.array([rec["samples"] for rec in throughput.records])
    save_eval("even_eval", est.evaluate(input_fn(cases.eval_batches(r, n))))
    predictions = list(est.predict(input_fn(cases.eval_batches(r, n))))
    results["predict/logits"] = np.array([p["logits"] for p in predictions])
    results["predict/item"] = np.array([p["item"] for p in predictions])

    # Uneven shares: without max_steps (all stop when the longest share ends), and with max_steps.
    est = strategy.estimator(cases.make_model_fn(strategy), os.path.join(out_dir, "uneven"), config=config)
    est.train(input_fn(cases.uneven_batches(r, n)), hooks=[CaptureHook("uneven")])
    est = strategy.estimator(cases.make_model_fn(strategy), os.path.join(out_dir, "uneven_max"), config=config)
    est.train(input_fn(cases.uneven_batches(r, n)), hooks=[CaptureHook("uneven_max")], max_steps=2)
    # Batch norm on uneven shares: a worker's empty batches must not make anything NaN.
    est = strategy.estimator(cases.make_batch_norm_model_fn(strategy), os.path.join(out_dir, "bn"), config=config)
    est.train(input_fn(cases.uneven_batches(r, n)), hooks=[CaptureHook("bn", [
        f"{layer}/{name}" for layer in ("bn_fused", "bn_keras")
        for name in ("gamma", "beta", "moving_mean", "moving_variance")])])

    # train_and_evaluate as a method, stopping at max_steps before the input ends.
    est = strategy.estimator(cases.make_model_fn(strategy), os.path.join(out_dir, "tae"), config=config)
    metrics, _ = est.train_and_evaluate(
        tf.estimator.TrainSpec(input_fn(cases.even_batches(r, n)), max_steps=3, hooks=[CaptureHook("tae")]),
        tf.estimator.EvalSpec(input_fn(cases.eval_batches(r, n)), steps=None))
    save_eval("tae_eval", metrics)

    # Incremental checkpoints: deltas every step, a restarted train() resumes from the chain; evaluate reads it.
    no_full_saves = tf.estimator.RunConfig(save_checkpoints_steps=None, save_checkpoints_secs=None,
                                           log_step_count_steps=1)
    slots = cases.SLOTS[cases.adagrad]
    batches = cases.even_batches(r, n)
    est = strategy.estimator(cases.make_model_fn(strategy, cases.adagrad), os.path.join(out_dir, "inc"),
                             config=no_full_saves, incremental_save_steps=1)
    est.train(input_fn(batches[:2]))
    est.train(input_fn(batches[2:]), hooks=[CaptureHook("inc", slots, at_start=True)])
    save_eval("inc_eval", est.evaluate(input_fn(cases.eval_batches(r, n))))
    if previous != "-":
        # DeepRec's Estimator recipe: the incremental saver among the chief hooks; the chain of another worker count.
        resume_dir = os.path.join(out_dir, "resume")
        if r == 0:
            shutil.copytree(os.path.join(previous, "inc"), resume_dir)
        comm.broadcast_string("copied")
        est = strategy.estimator(cases.make_model_fn(strategy, cases.adagrad, chief_hooks=lambda: [
            IncrementalSaverHook(resume_dir, incremental_save_steps=1)]), resume_dir, config=no_full_saves)
        est.train(input_fn(batches[:1]), hooks=[CaptureHook("resume", slots, at_start=True)])

    # ThroughputHook under MonitoredTrainingSession on a dense-only model: a known byte model.
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        x = tf.constant(np.full([2, 4], r + 1.0, np.float32))
        w = tf.compat.v1.get_variable("w", [4, 1], initializer=tf.compat.v1.ones_initializer())
        b = tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.zeros_initializer())
        loss = tf.reduce_mean(tf.matmul(x, w) + b)
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
        hook = ThroughputHook(every_n_steps=2, batch_size=2, loss=loss)
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook, tf.compat.v1.train.StopAtStepHook(5)]) as sess:
            while not sess.should_stop():
                sess.run(train_op)
        for key in ("step", "steps", "samples", "bytes"):
            results[f"mts/{key}"] = np.array([rec[key] for rec in hook.records])

np.savez(os.path.join(out_dir, f"rank{r}.npz"), **results)
