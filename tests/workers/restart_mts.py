"""HybridBackend's ``hb.train.MonitoredTrainingSession`` with a checkpoint every step, for the restart test.

argv: checkpoint_dir pid_dir last_step [R:S]
Trains restart_cases' model (hb exchange) to ``last_step``, resuming from the
latest checkpoint in ``checkpoint_dir`` (as MonitoredTrainingSession does).
Writes this worker's pid to ``pid_dir``. With ``R:S``, worker R holds after
step S and its checkpoint: the others wait for it inside step S + 1.
With ``RESTART_PREEMPTIBLE=1`` in the environment it checkpoints at the
start only and takes a second per step (the preemption and stall tests);
with ``RESTART_SLOW_SAVE=SECONDS:STEP`` rank 0's save of step STEP first
sleeps that long (a long save the others wait for).
"""

import os
import sys
import time

import tensorflow as tf

import collective.hb as hb
import restart_cases as rc

checkpoint_dir, pid_dir, last_step = sys.argv[1], sys.argv[2], int(sys.argv[3])
hold = rc.parse_hold(sys.argv[4] if len(sys.argv) > 4 else None)
preemptible = os.environ.get("RESTART_PREEMPTIBLE") == "1"
if os.environ.get("RESTART_SLOW_SAVE"):
    from collective.checkpoint import Saver

    seconds, slow_step = map(int, os.environ["RESTART_SLOW_SAVE"].split(":"))
    original_save = Saver.save

    def slow_save(self, sess, save_path, global_step=None, *args, **kwargs):
        if hb.context.rank == 0 and global_step == slow_step:
            print(f"rank 0 saving step {slow_step} slowly", flush=True)
            time.sleep(seconds)
        return original_save(self, sess, save_path, global_step, *args, **kwargs)

    Saver.save = slow_save


class ProgressHook(tf.compat.v1.train.SessionRunHook):
    """Prints the progress lines; it runs after the checkpoint hook, so step S's checkpoint is complete."""

    def __init__(self, progress: rc.Progress, global_step: tf.Variable):
        self.progress, self.global_step = progress, global_step

    def after_create_session(self, session, coord):
        self.progress.start(session.run(self.global_step))

    def after_run(self, run_context, run_values):
        step = run_context.session.run(self.global_step)
        self.progress.step(step)
        self.progress.hold_if_due(step, "after")
        if preemptible:
            time.sleep(1.0)


with hb.scope() as strategy, tf.Graph().as_default():
    r, n = strategy.rank(), strategy.world_size()
    rc.write_pid(pid_dir, r)
    inputs = rc.placeholders()
    _, train_op = rc.build(inputs, strategy)
    global_step = tf.compat.v1.train.get_global_step()
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=last_step), ProgressHook(rc.Progress(r, hold), global_step)]
    with hb.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir, save_checkpoint_steps=1000 if preemptible else 1,
                                           hooks=hooks) as sess:
        while not sess.should_stop():
            step = sess.run_step_fn(lambda step_context: step_context.session.run(global_step))
            sess.run(train_op, {inputs[key]: value for key, value in rc.local_inputs(step, r, n).items()})
