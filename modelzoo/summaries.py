"""TensorBoard events in ``model_dir``, laid out as ``tf.estimator`` lays them out.

Training scalars (``loss``, ``samples/s``) go to ``model_dir``, the final
evaluation metrics to ``model_dir/eval`` at the last global step, so
``tensorboard --logdir MODEL_DIR`` shows a run of either engine as it shows
an Estimator's. Rank 0 alone writes; on other ranks every call does nothing.

- :class:`TrainSummaries`: ``loss`` and global ``samples/s`` every ``every`` steps (the session engine);
- :class:`SamplesPerSecondHook`: ``samples/s`` for an Estimator (which writes its own ``loss``);
- :func:`write_eval`: the evaluation metrics.
"""

from __future__ import annotations

import os
import time
from typing import Mapping, Optional, Tuple

import tensorflow as tf

SAMPLES_PER_SEC = "samples/s"


def eval_dir(model_dir: str) -> str:
    """Where evaluation events go: ``model_dir/eval``, as ``Estimator.eval_dir()``."""
    return os.path.join(model_dir, "eval")


def _write(directory: str, step: int, scalars: Mapping[str, float]) -> None:
    writer = tf.compat.v1.summary.FileWriterCache.get(directory)
    values = [tf.compat.v1.Summary.Value(tag=tag, simple_value=float(value)) for tag, value in scalars.items()]
    writer.add_summary(tf.compat.v1.Summary(value=values), step)
    writer.flush()


class TrainSummaries:
    """Writes ``loss`` and global ``samples/s`` at step 1, every ``every`` steps and at ``max_steps`` (rank 0).

    ``samples/s`` covers the steps since the previous write (none at step 1,
    whose time is mostly graph warm-up); time spent in :meth:`pause` (checkpoint
    saves) is left out.
    """

    def __init__(self, model_dir: str, max_steps: int, global_batch: int, every: int, rank: int):
        self.model_dir, self.max_steps, self.global_batch, self.every = model_dir, max_steps, global_batch, every
        self.enabled = rank == 0 and every > 0
        self._last_time, self._last_step, self._paused = time.perf_counter(), 0, 0.0

    def step(self, step: int, loss: float) -> None:
        """Called after each training step with its loss."""
        if not self.enabled or (step != 1 and step % self.every and step != self.max_steps):
            return
        now = time.perf_counter()
        scalars = {"loss": loss}
        if step > 1 and step > self._last_step:
            seconds = max(now - self._last_time - self._paused, 1e-9)
            scalars[SAMPLES_PER_SEC] = (step - self._last_step) * self.global_batch / seconds
        _write(self.model_dir, step, scalars)
        self._last_time, self._last_step, self._paused = now, step, 0.0

    def pause(self, seconds: float) -> None:
        """Leaves ``seconds`` (spent outside training) out of the current interval."""
        self._paused += seconds


class SamplesPerSecondHook(tf.compat.v1.train.SessionRunHook):
    """Writes global ``samples/s`` to ``model_dir`` every ``every`` global steps and at the end; give it to
    rank 0 only (it runs no collective).

    The first step (mostly graph warm-up) is left out, as in :class:`TrainSummaries`.
    """

    def __init__(self, model_dir: str, global_batch: int, every: int):
        self._model_dir, self._global_batch, self._every = model_dir, global_batch, max(1, every)

    def begin(self):
        step = tf.compat.v1.train.get_global_step()
        if step is None:
            raise RuntimeError("SamplesPerSecondHook needs a global step")
        self._step_read = tf.identity(step.read_value())
        self._last: Optional[Tuple[float, int]] = None

    def before_run(self, run_context):  # pylint: disable=unused-argument
        return tf.compat.v1.train.SessionRunArgs(self._step_read)

    def after_run(self, run_context, run_values):  # pylint: disable=unused-argument
        step = int(run_values.results) + 1  # read before this step's update
        if self._last is None:
            self._last = (time.perf_counter(), step)
        elif step // self._every != self._last[1] // self._every:
            self._record(step)

    def end(self, session):
        step = int(session.run(self._step_read))
        if self._last is not None and step > self._last[1]:
            self._record(step)

    def _record(self, step: int) -> None:
        now = time.perf_counter()
        last_time, last_step = self._last
        _write(self._model_dir, step, {SAMPLES_PER_SEC: (step - last_step) * self._global_batch
                                       / max(now - last_time, 1e-9)})
        self._last = (now, step)


def write_eval(model_dir: str, step: int, metrics: Mapping[str, float], rank: int) -> None:
    """Rank 0 writes the evaluation ``metrics`` (``auc``, ``loss``, ``rmse``, ...) to ``model_dir/eval``."""
    if rank == 0 and metrics:
        _write(eval_dir(model_dir), step, metrics)
