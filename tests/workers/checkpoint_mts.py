"""MonitoredTrainingSession with checkpoint_dir on every worker, optionally killed part way.

argv: checkpoint_dir backend last_step [crash [secs]]
crash: ``exit_after_step:K`` (rank 1 exits after step K), ``die_in_save:K``
(rank 1 exits right after writing its part of the step-K checkpoint),
``die_in_merge:K`` (rank 0 dies while merging the step-K checkpoint, after
MergeV2Checkpoints has opened its index for writing) or ``none:0``.
``secs``: save every second (the workers agree when) instead of every 2
steps.
Prints ``rank R started at step S`` so the test sees where the run resumed.
"""

import os
import resource
import signal
import sys

import tensorflow as tf

import checkpoint_cases
import embedding_cases as cases
from collective import CollectiveStrategy
from collective.checkpoint import saver as saver_module

CRASH_CODE = 17
checkpoint_dir, backend, last_step = sys.argv[1], sys.argv[2], int(sys.argv[3])
crash, _, crash_step = (sys.argv[4] if len(sys.argv) > 4 else "none:0").partition(":")
every = {"save_checkpoint_secs": 1} if sys.argv[5:] == ["secs"] else {"save_checkpoint_steps": 2}
strategy = CollectiveStrategy(backend)
r, n = strategy.rank(), strategy.world_size()

if crash == "die_in_save" and r == 1:
    write_parts = saver_module.Saver._write_parts

    def write_parts_then_die(self, sess, parts_dir, shard_part, replicated_part):
        write_parts(self, sess, parts_dir, shard_part, replicated_part)
        if parts_dir.endswith(f"-{crash_step}_temp"):
            os._exit(CRASH_CODE)

    saver_module.Saver._write_parts = write_parts_then_die

if crash == "die_in_merge" and r == 0:
    commit = saver_module.Saver._commit

    def commit_then_die(self, sess, parts, *args, **kwargs):
        if not any(isinstance(arg, str) and arg.endswith(f"-{crash_step}") for arg in args):
            commit(self, sess, parts, *args, **kwargs)
            return
        # Writes past 16 bytes fail: the merge renames the data files, truncates the index and fails writing it.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        try:
            commit(self, sess, parts, *args, **kwargs)
        finally:
            os._exit(CRASH_CODE)

    saver_module.Saver._commit = commit_then_die

with strategy.scope(), tf.Graph().as_default():
    loss, train, feed = checkpoint_cases.build(strategy)
    tf.compat.v1.summary.scalar("loss", loss)
    global_step = tf.compat.v1.train.get_global_step()
    with tf.compat.v1.train.MonitoredTrainingSession(
            checkpoint_dir=checkpoint_dir, save_summaries_steps=1, log_step_count_steps=1, **every,
            hooks=[tf.compat.v1.train.StopAtStepHook(last_step=last_step)]) as sess:
        step = sess.run_step_fn(lambda step_context: step_context.session.run(global_step))
        print(f"rank {r} started at step {step}", flush=True)
        while not sess.should_stop():
            step = sess.run_step_fn(lambda step_context: step_context.session.run(global_step))
            sess.run(train, feed(cases.local_batch(step, r, n)))
            if crash == "exit_after_step" and r == 1 and step + 1 == int(crash_step):
                os._exit(CRASH_CODE)
