"""``strategy.estimator()`` with a checkpoint every step, for the restart test.

argv: model_dir pid_dir last_step [R:S]
Trains restart_cases' model (sok exchange) to ``max_steps=last_step``; the
Estimator resumes from the latest checkpoint in ``model_dir`` and the input
function starts at that checkpoint's step. Writes this worker's pid to
``pid_dir``. With ``R:S``, worker R holds right after it writes its part of
the step-S checkpoint, before the merge: the other workers have written
theirs and wait for it in the save's barrier. With ``RESTART_PREEMPTIBLE=1``
in the environment it checkpoints at the start only and takes a second per
step, printing ``rank R step S`` after each (the preemption test).
"""

import os
import sys
import time

import numpy as np
import tensorflow as tf

import embedding_cases as cases
import restart_cases as rc
from collective import CollectiveStrategy
from collective.checkpoint import saver as saver_module

model_dir, pid_dir, last_step = sys.argv[1], sys.argv[2], int(sys.argv[3])
hold = rc.parse_hold(sys.argv[4] if len(sys.argv) > 4 else None)
strategy = CollectiveStrategy("sok")
r, n = strategy.rank(), strategy.world_size()
rc.write_pid(pid_dir, r)
progress = rc.Progress(r, hold)


class ProgressListener(tf.compat.v1.train.CheckpointSaverListener):
    """Prints a progress line after each checkpoint."""

    def after_save(self, session, global_step_value):
        if progress.started is not None and global_step_value != progress.started:
            progress.step(global_step_value)


class StartHook(tf.compat.v1.train.SessionRunHook):
    """Prints the step the session starts at (restored, or 0)."""

    def after_create_session(self, session, coord):
        progress.start(session.run(tf.compat.v1.train.get_global_step()))


def write_parts_then_hold(self, sess, parts_dir: str, shard_part: str, replicated_part: str) -> None:
    """``Saver._write_parts``, then the hold: parts_dir is ``<model_dir>/model.ckpt-<step>_temp``."""
    write_parts(self, sess, parts_dir, shard_part, replicated_part)
    progress.hold_if_due(int(parts_dir[:-len("_temp")].rsplit("-", 1)[1]), "after writing its part of")


write_parts = saver_module.Saver._write_parts
if hold is not None and hold[0] == r:
    # No hook or listener runs between a worker's part and the merge: the hold goes into the Saver.
    saver_module.Saver._write_parts = write_parts_then_hold


def input_fn() -> tf.data.Dataset:
    """This worker's shares of the steps from the latest checkpoint's to ``last_step``."""
    shares = [rc.local_inputs(step, r, n) for step in range(rc.checkpoint_step(model_dir), last_step)]
    features = {key: np.concatenate([share[key] for share in shares]) for key in rc.INPUTS}
    labels = features.pop("label")
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(cases.BATCH // n)


def model_fn(features, labels, mode):
    loss, train_op = rc.build(dict(features, label=labels), strategy)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class SlowStepHook(tf.compat.v1.train.SessionRunHook):
    """A second per step, with a progress line after each."""

    def after_run(self, run_context, run_values):
        step = run_context.session.run(tf.compat.v1.train.get_global_step())
        print(f"rank {r} step {step}", flush=True)
        time.sleep(1.0)


preemptible = os.environ.get("RESTART_PREEMPTIBLE") == "1"
config = tf.estimator.RunConfig(save_checkpoints_steps=1000 if preemptible else 1, keep_checkpoint_max=3)
with strategy.scope(), tf.Graph().as_default():
    estimator = strategy.estimator(model_fn, model_dir, config=config)
    estimator.train(input_fn, max_steps=last_step, saving_listeners=[ProgressListener()],
                    hooks=[StartHook()] + ([SlowStepHook()] if preemptible else []))
