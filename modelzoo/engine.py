"""Train, evaluate and export a ``model_fn`` on every worker.

:class:`SessionEngine` runs the three in one TF1 session per worker on the
core of ``collective`` (sharded tables, exchanges, averaged gradients):

- train: ``max_steps`` steps of the model built once in TRAIN mode;
- evaluate: the same graph fed from the test data through a second
  iterator; every worker runs the same number of batches (the exchanges are
  collective), predictions are gathered and the metrics computed exactly
  over all workers' rows (:func:`modelzoo.heads.numpy_metrics`);
- checkpoints: every worker writes checkpoints of whole logical tables to
  ``model_dir`` (:class:`collective.checkpoint.Saver`) every
  ``save_checkpoints_steps`` steps and after the last one;
- export: from the last checkpoint rank 0 writes a SavedModel that plain
  TensorFlow serves (:func:`collective.integration.export.export_estimator`, the one
  export writer).

:class:`EstimatorEngine` does the same through ``strategy.estimator(...)``.
Both write TensorBoard events as Estimator does (:mod:`modelzoo.summaries`):
``loss`` and ``samples/s`` in ``model_dir``, the evaluation metrics in
``model_dir/eval``. :func:`make_engine` is the one place that picks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import tensorflow as tf

from collective import CollectiveStrategy, comm, context
from collective.cli import progress
from collective.byte_model import bytes_per_sample, sent_bytes
from collective.checkpoint import Saver
from collective.integration.export import export_estimator
from modelzoo import heads, summaries

logger = logging.getLogger("modelzoo")


@dataclasses.dataclass
class RunResult:
    """What a run measured. ``metrics`` is empty without evaluation, ``export_path`` None without export;
    ``bytes_per_sample``: :func:`collective.byte_model.bytes_per_sample` over the training steps;
    ``losses``: the training loss of every step (session engine) or log interval (estimator engine), the
    mean over all workers, as one process on the whole batch computes it."""

    steps: int
    train_loss: Optional[float]
    samples_per_sec: float
    bytes_per_sample: float
    metrics: Dict[str, float]
    export_path: Optional[str]
    predictions: Optional[Dict[str, np.ndarray]] = None
    losses: List[Tuple[int, float]] = dataclasses.field(default_factory=list)  # (step, training loss)


class Progress:
    """Rank 0's training progress, and the loss of every step it is told of (:attr:`losses`, on every rank).

    A bar of steps (:func:`collective.cli.progress.bar`) with the loss and the
    global samples/s since the previous line: on a terminal it redraws at
    every step; elsewhere (a pipe, a worker under the launcher) it writes a
    line every ``every`` steps and at the last. ``every`` 0: no bar.
    """

    def __init__(self, max_steps: int, global_batch: int, every: int, rank: int):
        self.max_steps, self.global_batch, self.every = max_steps, global_batch, every
        self.losses: List[Tuple[int, float]] = []
        self._bar = progress.bar(max_steps, "train", unit="step", seconds=0, disable=rank != 0 or not every)
        self._every_step = progress.on_terminal()
        self._postfix: Dict[str, str] = {}
        self._last_time, self._last_step = time.perf_counter(), 0

    def step(self, step: int, loss: float) -> None:
        """Step ``step`` (1-based) trained with loss ``loss``."""
        self.losses.append((step, loss))
        if self._bar.disable:
            return
        line = step % self.every == 0 or step == self.max_steps
        if not (line or self._every_step):
            return
        self._postfix["loss"] = f"{loss:.6g}"
        if line:
            now = time.perf_counter()
            rate = (step - self._last_step) * self.global_batch / max(now - self._last_time, 1e-9)
            self._postfix["samples/s"] = f"{rate:,.0f}"
            self._last_time, self._last_step = now, step
        self._bar.set_postfix(self._postfix, refresh=False)
        self._bar.update(step - self._bar.n)

    def close(self) -> None:
        self._bar.close()


class SessionEngine:
    """Runs a ``model_fn`` (TF1 Estimator style) with ``CollectiveStrategy`` in one session per worker.

    Args:
      strategy: the job's strategy; None trains plain TensorFlow in one process (the baseline).
      model_fn: ``model_fn(features, labels, mode, params) -> EstimatorSpec``; the PREDICT graph must
        create the same variables as the TRAIN graph.
      model_dir: where checkpoints, events and the export go. A run starts from fresh weights (it does
        not resume from a checkpoint there).
      params: passed to ``model_fn``; ``seed`` seeds the graph.
      save_checkpoints_steps: also save a checkpoint every this many steps (0: only after the last step).
      save_summary_steps: write ``loss`` and ``samples/s`` events every this many steps (0: none).
    """

    def __init__(self, strategy: Optional[CollectiveStrategy], model_fn: Callable, model_dir: str, params: Mapping,
                 *, save_checkpoints_steps: int = 0, save_summary_steps: int = 100):
        self.strategy, self.model_fn, self.model_dir, self.params = strategy, model_fn, model_dir, dict(params)
        self.save_checkpoints_steps, self.save_summary_steps = save_checkpoints_steps, save_summary_steps
        self.world_size = strategy.world_size() if strategy else 1
        self.rank = strategy.rank() if strategy else 0
        if strategy is None and comm.world_size() > 1:
            raise ValueError("the plain TensorFlow baseline runs in one process; start it without the launcher")

    def run(self, train_input_fn: Callable, max_steps: int, global_batch: int, *,
            eval_input_fn: Optional[Callable] = None, eval_steps: int = 0, eval_rows: int = 0,
            export_dir_base: Optional[str] = None, serving_input_receiver_fn: Optional[Callable] = None,
            log_every: int = 100, keep_predictions: bool = False) -> RunResult:
        """Trains ``max_steps`` steps, then evaluates ``eval_steps`` batches (this worker's first
        ``eval_rows`` predictions count) and exports, as asked."""
        scope = self.strategy.scope() if self.strategy else contextlib.nullcontext()
        with scope, tf.Graph().as_default():
            tf.compat.v1.set_random_seed(self.params.get("seed", 0))
            train_ds = train_input_fn()
            eval_ds = eval_input_fn() if eval_input_fn else None
            shapes = tf.compat.v1.data.get_output_shapes(eval_ds or train_ds)
            handle = tf.compat.v1.placeholder(tf.string, [], name="input_handle")
            iterator = tf.compat.v1.data.Iterator.from_string_handle(
                handle, tf.compat.v1.data.get_output_types(train_ds), shapes)
            features, labels = iterator.get_next()
            spec = self.model_fn(features, labels, heads.TRAIN, self.params)
            # The loss fetched each step: the mean over the workers, what one process on the global batch computes.
            spec = spec._replace(loss=comm.allreduce(spec.loss, "average"))
            loss_bytes = sent_bytes("allreduce", spec.loss.dtype.size, self.world_size)  # per step, left out below
            handles = [tf.compat.v1.data.make_one_shot_iterator(train_ds).string_handle()]
            if eval_ds is not None:
                handles.append(tf.compat.v1.data.make_one_shot_iterator(eval_ds).string_handle())
            rows_in = tf.compat.v1.placeholder(tf.float32, [None, None], name="eval_rows")
            gathered_rows = comm.allgather(rows_in)
            saver = Saver() if self.strategy else tf.compat.v1.train.Saver()
            # All workers' counters summed, read before this allreduce adds its own bytes.
            sent = comm.allreduce(comm.bytes_counter().read_value(), "sum")
            self._warn_if_resumable()
            with tf.compat.v1.Session(config=self._session_config()) as sess:
                sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer(),
                          tf.compat.v1.tables_initializer()])
                handle_values = sess.run(handles)
                if self.strategy:  # rank 0 logs where the tables live; every rank agrees on it before step 0
                    self.strategy.announce_plan()
                events = summaries.TrainSummaries(self.model_dir, max_steps, global_batch, self.save_summary_steps,
                                                  self.rank)

                def after_step(step: int, loss: float) -> float:
                    """Events and periodic checkpoints; returns the seconds spent saving."""
                    events.step(step, loss)
                    if not self.save_checkpoints_steps or step % self.save_checkpoints_steps or step == max_steps:
                        return 0.0
                    start = time.perf_counter()
                    self._save(saver, sess, step)
                    events.pause(time.perf_counter() - start)
                    return time.perf_counter() - start

                loss, rate, losses = self._train(sess, spec, {handle: handle_values[0]},
                                                 max_steps, global_batch, log_every,
                                                 after_step)
                # The loss averaged for the log above is left out, as ThroughputHook leaves out its own.
                per_sample = bytes_per_sample(sess.run(sent) - self.world_size * max_steps * loss_bytes,
                                              max_steps * global_batch)
                checkpoint = self._save(saver, sess, max_steps)
                metrics, predictions = {}, None
                if eval_ds is not None:
                    metrics, predictions = self._evaluate(sess, spec, labels, {handle: handle_values[1]},
                                                          eval_steps, eval_rows, rows_in, gathered_rows)
                    summaries.write_eval(self.model_dir, max_steps,
                                         {k: v for k, v in metrics.items() if k != "eval_rows"}, self.rank)
        export_path = None
        if export_dir_base and checkpoint is not None:
            path = export_estimator(self.model_fn, self.params, None, export_dir_base, serving_input_receiver_fn,
                                    checkpoint)
            export_path = path.decode() if isinstance(path, bytes) else path
        return RunResult(max_steps, loss, rate, per_sample, metrics, export_path,
                         predictions if keep_predictions else None, losses)

    def _session_config(self) -> tf.compat.v1.ConfigProto:
        """Pinned to this worker's GPU by its local rank, whatever started the workers."""
        base = tf.compat.v1.ConfigProto(allow_soft_placement=True)
        return self.strategy.session_config(base) if self.strategy else context.session_config(base)

    def _save(self, saver, sess, step: int) -> Optional[str]:
        """Every worker saves the checkpoint of ``step`` to ``model_dir`` (whole logical tables)."""
        tf.io.gfile.makedirs(self.model_dir)
        return saver.save(sess, os.path.join(self.model_dir, "model.ckpt"), global_step=step)

    def _warn_if_resumable(self) -> None:
        if self.rank == 0 and tf.io.gfile.isdir(self.model_dir) and tf.train.latest_checkpoint(self.model_dir):
            logger.warning("%s holds checkpoints of an earlier run: the session engine starts from fresh weights "
                           "and writes its own checkpoints there (--engine estimator resumes)", self.model_dir)

    def _train(self, sess, spec, feed, max_steps: int, global_batch: int, log_every: int,
               after_step: Optional[Callable[[int, float], float]] = None):
        """Runs ``max_steps`` steps; ``after_step(step, loss)`` returns seconds to leave out of samples/s."""
        progress = Progress(max_steps, global_batch, log_every, self.rank)
        warmup = min(5, max_steps // 10)
        start, loss, paused = time.perf_counter(), float("nan"), 0.0
        for step in range(1, max_steps + 1):
            loss, _ = sess.run([spec.loss, spec.train_op], feed)
            if not np.isfinite(loss):
                raise FloatingPointError(f"training loss is {loss} at step {step}; lower --learning_rate")
            if step == warmup:
                start, paused = time.perf_counter(), 0.0
            progress.step(step, float(loss))
            if after_step is not None:
                paused += after_step(step, float(loss))
        seconds = time.perf_counter() - start - paused
        progress.close()
        rate = (max_steps - warmup) * global_batch / seconds if max_steps > warmup else float("nan")
        return float(loss), rate, progress.losses

    def _evaluate(self, sess, spec, labels, feed, eval_steps: int, eval_rows: int, rows_in, gathered_rows):
        # The head's one-number-per-row predictions (logits, logistic, class_ids or predictions); the rest
        # (probabilities [B, 2], class strings) follow from them.
        names: List[str] = sorted(n for n, t in spec.predictions.items()
                                  if (t.dtype.is_floating or t.dtype.is_integer) and t.shape[1:].num_elements() == 1)
        label_names: List[str] = sorted(labels)
        fetch = ([spec.predictions[n] for n in names], [labels[n] for n in label_names])
        columns: List[np.ndarray] = []
        for _ in range(eval_steps):
            preds, labs = sess.run(fetch, feed)
            columns.append(np.stack([np.asarray(x, np.float32).reshape(-1) for x in preds + labs], axis=1))
        local = np.concatenate(columns)[:eval_rows] if columns else np.zeros((0, len(names) + len(label_names)),
                                                                                np.float32)
        rows = sess.run(gathered_rows, {rows_in: local})
        predictions = {n: rows[:, i] for i, n in enumerate(names)}
        label_values = {n: rows[:, len(names) + i] for i, n in enumerate(label_names)}
        metrics = heads.numpy_metrics(self.params, predictions, label_values)
        metrics["eval_rows"] = int(rows.shape[0])
        return metrics, {**predictions, **label_values}




class EstimatorEngine:
    """Runs a ``model_fn`` through ``strategy.estimator(...)`` (:mod:`collective.integration.estimator`).

    Training writes checkpoints to ``model_dir`` (every ``save_checkpoints_steps``
    steps and at the end) and resumes from one found there up to ``max_steps``
    global steps. The input resumes too: each worker skips the batches of the
    steps the checkpoint holds, so a run stopped and started again with more
    ``max_steps`` trains what one uninterrupted run trains. Estimator writes
    the ``loss`` and evaluation events, :class:`modelzoo.summaries.SamplesPerSecondHook`
    adds ``samples/s``. Evaluation uses the Estimator's global
    ``eval_metric_ops`` (AUC from thresholds, so it differs slightly from
    :class:`SessionEngine`'s exact AUC); export goes through ``collective.integration.export``.
    """

    finite_eval = True  # the Estimator pads uneven shares itself: give it one pass over each worker's rows

    def __init__(self, strategy: CollectiveStrategy, model_fn: Callable, model_dir: str, params: Mapping,
                 *, save_checkpoints_steps: int = 0, save_summary_steps: int = 100):
        self.strategy, self.model_fn, self.model_dir, self.params = strategy, model_fn, model_dir, dict(params)
        self.save_checkpoints_steps, self.save_summary_steps = save_checkpoints_steps, save_summary_steps

    def run(self, train_input_fn: Callable, max_steps: int, global_batch: int, *,
            eval_input_fn: Optional[Callable] = None, eval_steps: int = 0, eval_rows: int = 0,
            export_dir_base: Optional[str] = None, serving_input_receiver_fn: Optional[Callable] = None,
            log_every: int = 100, keep_predictions: bool = False) -> RunResult:
        from collective.integration.hooks import ThroughputHook  # pylint: disable=import-outside-toplevel

        del eval_rows, keep_predictions
        config = tf.estimator.RunConfig(tf_random_seed=self.params.get("seed", 0),
                                        save_checkpoints_steps=self.save_checkpoints_steps or max_steps,
                                        save_checkpoints_secs=None, save_summary_steps=self.save_summary_steps,
                                        log_step_count_steps=None)
        with self.strategy.scope():
            estimator = self.strategy.estimator(lambda features, labels, mode, params: self.model_fn(
                features, labels, mode, params), self.model_dir, config=config, params=self.params)
            hook = ThroughputHook(every_n_steps=max(1, log_every or max_steps), global_batch_size=global_batch,
                                  loss=_trained_loss)
            train_hooks = [hook]
            if self.strategy.rank() == 0 and self.save_summary_steps:
                train_hooks.append(summaries.SamplesPerSecondHook(self.model_dir, global_batch,
                                                                  self.save_summary_steps))
            estimator.train(_resumed_input_fn(train_input_fn, _checkpoint_step(self.model_dir)), max_steps=max_steps,
                            hooks=train_hooks)
            metrics: Dict[str, float] = {}
            if eval_input_fn is not None:
                result = estimator.evaluate(lambda: eval_input_fn(), steps=eval_steps or None)
                metrics = {k: float(v) for k, v in result.items() if k != "global_step"}
            export_path = None
            if export_dir_base:
                path = estimator.export_saved_model(export_dir_base, serving_input_receiver_fn)
                export_path = path.decode() if isinstance(path, bytes) else path
        by_step: Dict[int, Dict[str, float]] = {}
        for record in hook.records:  # the hook's end() may log the last step again: keep its first record
            by_step.setdefault(int(record["step"]), record)
        records = [by_step[s] for s in sorted(by_step)][1:] or list(by_step.values())  # the first: warm-up
        samples = sum(r["samples"] for r in records)
        seconds = sum(r["seconds"] for r in records)
        sent = sum(r["bytes"] for r in records)
        return RunResult(max_steps, records[-1].get("loss") if records else None,
                         samples / seconds if seconds else float("nan"), bytes_per_sample(sent, samples),
                         metrics, export_path,
                         losses=[(s, by_step[s]["loss"]) for s in sorted(by_step) if "loss" in by_step[s]])


def _checkpoint_step(model_dir: str) -> int:
    """The global step of the latest checkpoint in ``model_dir``; 0 without one."""
    latest = tf.train.latest_checkpoint(model_dir) if tf.io.gfile.isdir(model_dir) else None
    return int(tf.train.load_checkpoint(latest).get_tensor(tf.compat.v1.GraphKeys.GLOBAL_STEP)) if latest else 0


def _resumed_input_fn(input_fn: Callable[[], tf.data.Dataset], step: int) -> Callable[[], tf.data.Dataset]:
    """``input_fn`` without the batches of the first ``step`` steps, which a checkpoint at ``step`` has
    trained on: each step takes one batch of every worker's (endless) share, so a resumed run reads the
    batches an uninterrupted run reads next. The skipped batches are read and dropped."""
    if step:
        logger.info("resuming at global step %d: skipping the %d batches of this worker's input trained on "
                    "before", step, step)
    return lambda: input_fn().skip(step) if step else input_fn()


def _trained_loss() -> tf.Tensor:
    """The loss Estimator trains on (under ``strategy.estimator`` the workers' mean), which it adds to
    ``LOSSES`` before the hooks begin."""
    return tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)[-1]


ENGINES = ("session", "estimator")


def make_engine(name: str, strategy: Optional[CollectiveStrategy], model_fn: Callable, model_dir: str,
                params: Mapping, **options):
    """The engine a ``train.py`` runs on: ``session`` (:class:`SessionEngine`) or ``estimator``
    (:class:`EstimatorEngine`, not for the plain baseline). ``options``: ``save_checkpoints_steps``,
    ``save_summary_steps``."""
    if name == "session":
        return SessionEngine(strategy, model_fn, model_dir, params, **options)
    if name == "estimator" and strategy is not None:
        return EstimatorEngine(strategy, model_fn, model_dir, params, **options)
    raise ValueError(f"--engine {name!r} is not one of {', '.join(ENGINES)} (estimator needs CollectiveStrategy: "
                     "drop --plain)")
