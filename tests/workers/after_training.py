"""Trains 2 steps under MonitoredTrainingSession with a checkpoint_dir, then works on after the session closed.

argv: model_dir seconds
Rank 1's first step takes ``seconds`` longer (a slow first step). After the
session, rank 1 returns from the export at once and exits; rank 0 exports a
SavedModel that takes ``seconds``, prints the phase its heartbeat showed
meanwhile, and sends itself SIGTERM: with training over, the signal must end
it. If it does not, rank 0 prints "still running after SIGTERM" and exits 0.
"""

import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf

from collective import CollectiveStrategy
from collective.runtime.stall import ENV, read_beat

model_dir, seconds = sys.argv[1], float(sys.argv[2])
strategy = CollectiveStrategy()
r = strategy.rank()


def model(x):
    w = tf.compat.v1.get_variable("w", [2, 1], initializer=tf.compat.v1.ones_initializer())
    return tf.matmul(x, w)


class SlowFirstStep(tf.compat.v1.train.SessionRunHook):
    def __init__(self):
        self.slept = False

    def before_run(self, run_context):
        if not self.slept:
            self.slept = True
            time.sleep(seconds)


phases = []


def signature_def():
    time.sleep(seconds)
    phases.append(read_beat(os.environ[ENV]).phase)
    x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
    return tf.compat.v1.saved_model.predict_signature_def({"x": x}, {"y": model(x)})


with strategy.scope():
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        loss = tf.reduce_mean(model(tf.constant(np.arange(6, dtype=np.float32).reshape(3, 2))))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=step)
        hooks = [tf.compat.v1.train.StopAtStepHook(2)] + ([SlowFirstStep()] if r == 1 else [])
        with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=model_dir, hooks=hooks) as sess:
            while not sess.should_stop():
                sess.run(train)
    strategy.export_saved_model(os.path.join(model_dir, "export"), model_dir, signature_def)
    if r == 0:
        print(f"rank 0 exported with heartbeat phase {phases[0]}", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(3 * seconds)
        print("still running after SIGTERM", flush=True)
