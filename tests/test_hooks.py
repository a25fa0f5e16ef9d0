"""collective.integration.hooks in one process (the multi-worker numbers are checked in test_estimator.py)."""

import os
import signal

import numpy as np
import pytest
import tensorflow as tf

from collective import CollectiveStrategy
from collective.runtime import preemption
from collective.integration import hooks
from collective.integration.hooks import GlobalMetricsHook, MetricMismatchError, ThroughputHook


def linear_model():
    step = tf.compat.v1.train.get_or_create_global_step()
    x = tf.constant(np.arange(6, dtype=np.float32).reshape(3, 2))
    w = tf.compat.v1.get_variable("w", [2, 1], initializer=tf.compat.v1.ones_initializer())
    loss = tf.reduce_mean(tf.matmul(x, w))
    return loss, tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=step)


def run_steps(hooks, steps):
    with tf.compat.v1.train.MonitoredTrainingSession(
            hooks=list(hooks) + [tf.compat.v1.train.StopAtStepHook(steps)]) as sess:
        while not sess.should_stop():
            sess.run(tf.compat.v1.get_collection("train_op")[0])


@pytest.mark.parametrize("kwargs", [{"every_n_steps": 0}, {"batch_size": 2, "global_batch_size": 4},
                                    {"batch_size": 2, "samples": tf.constant(1)}])
def test_throughput_hook_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        ThroughputHook(**kwargs)


def test_throughput_hook_records_under_monitored_training_session(caplog):
    with CollectiveStrategy().scope(), tf.Graph().as_default():
        loss, train_op = linear_model()
        tf.compat.v1.add_to_collection("train_op", train_op)
        hook = ThroughputHook(every_n_steps=2, batch_size=3, loss=loss)
        with caplog.at_level("INFO", logger="collective.integration.hooks"):
            run_steps([hook], 5)
    assert [r["step"] for r in hook.records] == [2, 4, 5]
    assert [r["samples"] for r in hook.records] == [6, 6, 3]
    assert all(r["bytes"] == 0 and r["bytes_per_sample"] == 0 for r in hook.records)  # one worker sends nothing
    assert hook.records[0]["loss"] == pytest.approx(5.0 - 0.13, rel=1e-5)  # after one SGD step
    assert sum("samples/s (global, 1 workers)" in m for m in caplog.messages) == 3


def test_global_metrics_hook_leaves_one_worker_values_alone():
    with CollectiveStrategy().scope(), tf.Graph().as_default():
        value, update = tf.compat.v1.metrics.mean(tf.constant([1.0, 2.0, 6.0]))
        hook = GlobalMetricsHook()
        hook.begin()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.local_variables_initializer())
            sess.run(update)
            hook.end(sess)
            assert sess.run(value) == pytest.approx(3.0)


def test_metric_variables_are_summed_in_name_order_whatever_the_collection_order():
    """Regression: the hook summed METRIC_VARIABLES by position, and Estimator adds Keras metrics' variables
    from a set (an order of each process's own): a count was added to another worker's total."""
    def order(reverse):
        with tf.Graph().as_default():
            metrics = [tf.keras.metrics.Mean(name="label_mean"), tf.keras.metrics.AUC(num_thresholds=5, name="auc")]
            variables = [v for m in metrics for v in m.variables]
            ordered = hooks.in_reduction_order(list(reversed(variables)) if reverse else variables)
            return [(v.op.name, v.shape.as_list()) for v in ordered], [hooks.metric_signature(v) for v in ordered]
    assert order(False) == order(True)
    names = [name for name, _ in order(False)[0]]
    assert names == sorted(names) and {"count", "total", "true_positives"} <= set(names)


def test_metric_variables_another_worker_lacks_are_named():
    with tf.Graph().as_default():
        mine = tf.keras.metrics.Mean(name="label_mean").variables
        theirs = [hooks.metric_signature(mine[0])]  # the other worker has the total only
        lines = hooks.unmatched(hooks.in_reduction_order(mine), [theirs])
        assert lines and "['count']" in lines[0], lines
        assert hooks.unmatched(mine, [[hooks.metric_signature(v) for v in mine]]) == []
    with pytest.raises(MetricMismatchError, match="'a'"):
        hooks.in_reduction_order([_Named("a"), _Named("a")])  # two metrics of one name: no way to tell them apart


class _Named:
    """A metric variable as the hook sees it: only its name matters here."""

    def __init__(self, name):
        self.name = name


class _SigtermAfterLastStep(tf.compat.v1.train.SessionRunHook):
    """Sends this process SIGTERM after the last step, once the workers' last agreement is past."""

    def after_run(self, run_context, run_values):
        if run_context.session.run(tf.compat.v1.train.get_global_step()) == 2:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize("late_sigterm", [False, True])
def test_sigterm_gets_its_behaviour_back_when_the_session_closes(tmp_path, late_sigterm):
    """Regression: the preemption handler stayed installed after training, so a later SIGTERM only set a flag.

    A SIGTERM after the last step's agreement ends the program with 143 once the last checkpoint is saved.
    """
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    try:
        with CollectiveStrategy().scope(), tf.Graph().as_default():
            _, train_op = linear_model()
            tf.compat.v1.add_to_collection("train_op", train_op)
            hooks = [_SigtermAfterLastStep()] if late_sigterm else []
            with tf.compat.v1.train.MonitoredTrainingSession(
                    checkpoint_dir=str(tmp_path), hooks=hooks + [tf.compat.v1.train.StopAtStepHook(2)]) as sess:
                assert signal.getsignal(signal.SIGTERM) is preemption._on_sigterm  # pylint: disable=protected-access
                while not sess.should_stop():
                    sess.run(train_op)
        assert not late_sigterm, "a SIGTERM after the last step was swallowed"
    except SystemExit as stop:
        assert late_sigterm and stop.code == preemption.EXIT_CODE
    finally:
        handler = signal.getsignal(signal.SIGTERM)
        preemption.uninstall()
    assert handler is signal.SIG_DFL
    assert tf.train.latest_checkpoint(str(tmp_path)) == str(tmp_path / "model.ckpt-2")


def test_heartbeat_step_lines_leave_the_step_path_and_still_reach_the_launcher(tmp_path, monkeypatch):
    """Step lines closer than STEP_LINE_INTERVAL are left to the background thread (no file write per step), which
    writes the newest state within the interval; other phases go out at once."""
    import time  # pylint: disable=import-outside-toplevel

    from collective.runtime import heartbeat  # pylint: disable=import-outside-toplevel
    from collective.runtime.stall import ENV, read_beat  # pylint: disable=import-outside-toplevel

    path = str(tmp_path / "heartbeat")
    monkeypatch.setenv(ENV, path)
    monkeypatch.setattr(heartbeat, "_state", {"steps": 0, "phase": None})
    monkeypatch.setattr(heartbeat, "_written", {"line": None, "phase": None, "at": float("-inf")})
    hook = heartbeat.HeartbeatHook()
    hook.begin()
    assert (read_beat(path).phase, read_beat(path).steps) == ("idle", 0)
    start = time.monotonic()
    for _ in range(200):
        hook.before_run(None)
        hook.after_run(None, None)
    if time.monotonic() - start < heartbeat.STEP_LINE_INTERVAL:
        assert read_beat(path).steps < 200, "every step wrote its line on the step's path"
    deadline = time.monotonic() + 5 * heartbeat.STEP_LINE_INTERVAL
    while read_beat(path) is None or read_beat(path).steps != 200:
        assert time.monotonic() < deadline, f"the newest state never reached the file: {read_beat(path)}"
        time.sleep(0.05)
    assert read_beat(path).phase == "idle"
    hook.before_run(None)  # a step that hangs: the launcher must see "inside step 201" within the interval
    deadline = time.monotonic() + 5 * heartbeat.STEP_LINE_INTERVAL
    while read_beat(path).phase != "step":
        assert time.monotonic() < deadline, "a hanging step never showed as 'step'"
        time.sleep(0.05)
    with heartbeat.phase("save"):  # other phases go out at once
        assert read_beat(path).phase == "save"
    assert read_beat(path).phase == "step"
