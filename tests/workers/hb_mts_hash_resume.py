"""A hash-table model under HybridBackend's ``hb.train.MonitoredTrainingSession`` with a checkpoint_dir.

argv: (checkpoint_dir last_step)... For each pair in order, in a graph of its own (as a restarted job builds
one), trains until ``last_step`` (resuming from the latest checkpoint there, as MonitoredTrainingSession does)
and saves at the end: a pair naming a folder an earlier pair trained in resumes there.
"""

import sys

import tensorflow as tf

import checkpoint_cases
import collective.hb as hb

runs = sys.argv[1:]
for checkpoint_dir, last_step in zip(runs[::2], map(int, runs[1::2])):
    with hb.scope() as strategy, tf.Graph().as_default():
        r, n = strategy.rank(), strategy.world_size()
        train, feed = checkpoint_cases.build_hash(strategy)
        global_step = tf.compat.v1.train.get_global_step()
        with hb.train.MonitoredTrainingSession(checkpoint_dir=checkpoint_dir, save_checkpoint_steps=100,
                                               hooks=[tf.compat.v1.train.StopAtStepHook(last_step=last_step)]) as sess:
            while not sess.should_stop():
                step = sess.run_step_fn(lambda step_context: step_context.session.run(global_step))
                sess.run(train, feed(step, r, n))
