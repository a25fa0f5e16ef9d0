"""``MonitoredTrainingSession`` and checkpoint hooks for synchronous workers.

Inside ``CollectiveStrategy.scope()`` (see :mod:`collective.tf_internals.patches`):

- ``tf.compat.v1.train.MonitoredTrainingSession`` is :func:`MonitoredTrainingSession`:
  every worker creates, initialises and restores its session as a chief
  (each holds its own shards), every worker saves checkpoints at the same
  steps with :class:`collective.checkpoint.Saver`, and only rank 0 writes
  summaries, step counters, ``graph.pbtxt`` and event files or runs
  ``chief_only_hooks``.
- a ``Scaffold`` without a saver gets a :class:`collective.checkpoint.Saver`.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import List, Optional

import tensorflow as tf

from collective import comm, context
from collective.runtime import heartbeat, preemption
from collective.checkpoint import Saver
from collective.checkpoint.saver import default_saver  # noqa: F401  (its public home: Scaffold's default saver)
from collective.integration.hooks import PlanHook
from collective.integration.incremental import IncrementalSaverHook
from collective.embedding import modes, packed_tables
from collective.embedding.table import SHARDED_COLLECTION, shard_of
from collective.tf_internals import (basic_session_run_hooks, monitored_session, patches, saver_lib, training_util,
                                     variables)

logger = logging.getLogger("collective.integration.session")

USE_DEFAULT = monitored_session.USE_DEFAULT
_SAVER_PARAMETERS = inspect.signature(saver_lib.Saver.__init__)
_DEFAULT_CHECKPOINT_SECS = 600


class CheckpointSaverHook(basic_session_run_hooks.CheckpointSaverHook):
    """``tf.compat.v1.train.CheckpointSaverHook`` that every worker runs.

    Every worker saves at the same steps: with ``save_steps`` the global step
    (equal everywhere) decides; with ``save_secs`` the workers agree after
    each step (one small allreduce per step) so that a save starts on all of
    them or on none. Only rank 0 writes ``graph.pbtxt`` and event files.
    The save at the start is skipped when the session was just restored from
    the checkpoint it would write (a resumed run), which stays as it was.
    SIGTERM on any worker is a preemption notice (:mod:`collective.runtime.preemption`):
    all save the step they are at and exit. With ``save_steps`` that takes
    the same small per-step allreduce. At :meth:`end` SIGTERM gets its
    previous behaviour back.
    """

    def __init__(self, checkpoint_dir, save_secs=None, save_steps=None, saver=None,
                 checkpoint_basename="model.ckpt", scaffold=None, listeners=None, save_graph_def=True):
        super().__init__(checkpoint_dir, save_secs=save_secs, save_steps=save_steps, saver=saver,
                         checkpoint_basename=checkpoint_basename, scaffold=scaffold, listeners=listeners,
                         save_graph_def=save_graph_def)
        self._by_time = save_secs is not None
        self._chief = comm.rank() == 0

    def begin(self):
        self._summary_writer = (tf.compat.v1.summary.FileWriterCache.get(self._checkpoint_dir)
                                if self._chief else None)
        self._global_step_tensor = tf.compat.v1.train.get_global_step()
        if self._global_step_tensor is None:
            raise RuntimeError("Global step should be created to use CheckpointSaverHook.")
        self._preemptible = preemption.install()
        if self._by_time or self._preemptible:
            self._due = tf.compat.v1.placeholder(tf.int32, [2], name="checkpoint_due_or_preempted")
            self._any_due = comm.allreduce_max(self._due)
        for listener in self._listeners:
            listener.begin()

    def after_create_session(self, session, coord):
        global_step = session.run(self._global_step_tensor)
        if self._chief:
            if self._save_graph_def:
                tf.io.write_graph(tf.compat.v1.get_default_graph().as_graph_def(add_shapes=True),
                                  self._checkpoint_dir, "graph.pbtxt")
            graph = tf.compat.v1.get_default_graph()
            saver = self._get_saver()
            meta_graph_def = tf.compat.v1.train.export_meta_graph(
                graph_def=graph.as_graph_def(add_shapes=True), saver_def=saver.saver_def if saver else None)
            self._summary_writer.add_graph(graph)
            self._summary_writer.add_meta_graph(meta_graph_def)
        restored = self._restored_checkpoint(session, global_step)
        if restored:
            logger.info("Not saving step %d again: the session was just restored from %s.", global_step, restored)
        else:
            self._save(session, global_step)
        self._timer.update_last_triggered_step(global_step)

    def _restored_checkpoint(self, session, step: int) -> Optional[str]:
        """The checkpoint of ``step`` this hook would write, if the session was just restored from it.

        Saving it again would rewrite a complete checkpoint in place (its data
        files renamed over, its index truncated and rewritten), and a crash in
        between would leave the latest checkpoint torn. Every worker restored
        the same checkpoint (the state file names one), so all skip together.
        """
        saver = self._get_saver()
        restored = saver.restored_into(session) if isinstance(saver, Saver) else None
        if restored is None:
            return None
        target = saver.checkpoint_file(self._save_path, step)
        return restored if os.path.normpath(restored) == os.path.normpath(target) else None

    def after_run(self, run_context, run_values):
        stale_global_step = run_values.results
        due = self._timer.should_trigger_for_step(stale_global_step + self._steps_per_run)
        if self._by_time or self._preemptible:
            flags = [int(due), int(preemption.requested())]
            due, preempted = run_context.session.run(self._any_due, {self._due: flags})
            if preempted:
                self._save_and_exit(run_context.session)
        if not due:
            return
        global_step = run_context.session.run(self._global_step_tensor)
        if self._by_time or self._timer.should_trigger_for_step(global_step):
            self._timer.update_last_triggered_step(global_step)
            if self._save(run_context.session, global_step):
                run_context.request_stop()

    def end(self, session):
        try:
            super().end(session)  # the checkpoint of the last step
        finally:
            # Training is over: a SIGTERM from now on (the launcher stopping the job) ends the process.
            preempted = preemption.uninstall() if self._preemptible else False
        if preempted:
            preemption.exit_after_save(self._checkpoint_file(session.run(self._global_step_tensor)))

    def _save_and_exit(self, session) -> None:
        step = session.run(self._global_step_tensor)
        if step != self._timer.last_triggered_step():
            self._timer.update_last_triggered_step(step)
            self._save(session, step)
        preemption.exit_after_save(self._checkpoint_file(step))

    def _checkpoint_file(self, step: int) -> str:
        saver = self._get_saver()
        return saver.checkpoint_file(self._save_path, step) if isinstance(saver, Saver) else f"{self._save_path}-{step}"

    def _save(self, session, step):
        for listener in self._listeners:
            listener.before_save(session, step)
        logger.info("Saving checkpoints for %d into %s.", step, self._save_path)
        with heartbeat.phase("save"):
            self._get_saver().save(session, self._save_path, global_step=step, write_meta_graph=self._save_graph_def)
        if self._chief:
            self._summary_writer.add_session_log(
                tf.compat.v1.SessionLog(status=tf.compat.v1.SessionLog.CHECKPOINT,
                                        checkpoint_path=self._save_path), step)
        should_stop = False
        for listener in self._listeners:
            if listener.after_save(session, step):
                should_stop = True
        return should_stop


def global_variables_initializer() -> tf.Operation:
    """``tf.compat.v1.global_variables_initializer`` that also initialises this graph's byte counter.

    The counter is a local variable (never checkpointed, never broadcast), so
    a program that runs only the global initializer would otherwise fail in
    its first collective with "Resource .../collective_bytes_sent does not exist".
    """
    if tf.executing_eagerly():
        return patches.original(variables, "global_variables_initializer")()
    packed_tables.seal_pending()  # a packed table never looked up still gets its rows initialised
    return tf.compat.v1.variables_initializer(variables.global_variables() + comm.graph_counters())


def ensure_global_step_read(graph: Optional[tf.Graph] = None) -> Optional[tf.Tensor]:
    """Registers a global-step read that runs no collective, before TensorFlow makes its own.

    TensorFlow's ``_get_or_create_global_step_read`` falls back to the global
    step's ``initial_value``, which inside ``scope()`` is rank 0's value
    broadcast: every evaluation of that read would run a broadcast, and the
    hooks that evaluate it on rank 0 only (step counter, summaries) would
    hang the job. Call this after creating the global step and before any
    hook's ``begin()``; MonitoredTrainingSession does.
    """
    graph = graph or tf.compat.v1.get_default_graph()
    existing = graph.get_collection(training_util.GLOBAL_STEP_READ_KEY)
    if existing:
        return existing[0]
    step = tf.compat.v1.train.get_global_step(graph)
    if step is None:
        return None
    with graph.as_default(), graph.name_scope(None), graph.name_scope(step.op.name + "/"):
        value = tf.cond(tf.compat.v1.is_variable_initialized(step), step.read_value,
                        lambda: tf.zeros([], step.dtype.base_dtype))
        read = tf.add(value, 0, name="read_no_collective")
    graph.add_to_collection(training_util.GLOBAL_STEP_READ_KEY, read)
    return read


def MonitoredTrainingSession(master="", is_chief=True, checkpoint_dir=None, scaffold=None, hooks=None,  # pylint: disable=invalid-name
                             chief_only_hooks=None, save_checkpoint_secs=USE_DEFAULT,
                             save_summaries_steps=USE_DEFAULT, save_summaries_secs=USE_DEFAULT, config=None,
                             stop_grace_period_secs=120, log_step_count_steps=100, max_wait_secs=7200,
                             save_checkpoint_steps=USE_DEFAULT, summary_dir=None, save_graph_def=True,
                             save_incremental_checkpoint_secs=None, save_incremental_checkpoint_steps=None):
    """``tf.compat.v1.train.MonitoredTrainingSession`` for synchronous workers (same arguments).

    Every worker is a chief for session creation (``is_chief`` is ignored:
    each worker initialises or restores its own shards); the session is pinned
    to this worker's GPU (``config`` is copied, see :func:`collective.context.session_config`); rank 0 alone runs
    ``chief_only_hooks`` and writes summaries and step counts. Checkpoints
    are written by all workers together with :class:`CheckpointSaverHook`.
    ``save_incremental_checkpoint_secs`` (DeepRec's argument) or
    ``save_incremental_checkpoint_steps`` add deltas between them
    (:class:`~collective.integration.incremental.IncrementalSaverHook`), and the
    session then resumes from the newest complete chain.
    """
    del is_chief
    chief = comm.rank() == 0
    ensure_global_step_read()
    if save_checkpoint_secs == USE_DEFAULT and save_checkpoint_steps == USE_DEFAULT:
        save_checkpoint_secs, save_checkpoint_steps = _DEFAULT_CHECKPOINT_SECS, None
    elif save_checkpoint_secs == USE_DEFAULT:
        save_checkpoint_secs = None
    elif save_checkpoint_steps == USE_DEFAULT:
        save_checkpoint_steps = None
    all_hooks: List = []
    if checkpoint_dir and ((save_checkpoint_secs and save_checkpoint_secs > 0)
                           or (save_checkpoint_steps and save_checkpoint_steps > 0)):
        all_hooks.append(CheckpointSaverHook(checkpoint_dir, save_secs=save_checkpoint_secs or None,
                                             save_steps=save_checkpoint_steps or None, scaffold=scaffold,
                                             save_graph_def=save_graph_def))
    if checkpoint_dir and (save_incremental_checkpoint_secs or save_incremental_checkpoint_steps):
        all_hooks.append(IncrementalSaverHook(checkpoint_dir, incremental_save_steps=save_incremental_checkpoint_steps,
                                              incremental_save_secs=None if save_incremental_checkpoint_steps
                                              else save_incremental_checkpoint_secs, scaffold=scaffold))
    all_hooks.extend(hooks or [])
    all_hooks += [heartbeat.HeartbeatHook(), PlanHook()]
    original = patches.original(monitored_session, "MonitoredTrainingSession")
    if not chief:
        save_summaries_steps = save_summaries_secs = log_step_count_steps = None
        summary_dir, chief_only_hooks = None, None
    return original(master=master, is_chief=True, checkpoint_dir=checkpoint_dir, scaffold=scaffold,
                    hooks=all_hooks, chief_only_hooks=chief_only_hooks, save_checkpoint_secs=None,
                    save_summaries_steps=save_summaries_steps, save_summaries_secs=save_summaries_secs,
                    config=context.session_config(config), stop_grace_period_secs=stop_grace_period_secs,
                    log_step_count_steps=log_step_count_steps, max_wait_secs=max_wait_secs,
                    save_checkpoint_steps=None, summary_dir=summary_dir, save_graph_def=save_graph_def)


def _holds_sharded_tables(var_list) -> bool:
    if var_list is None:
        packed_tables.seal_pending()  # the default var_list then holds every packed table's group variable
        return bool(tf.compat.v1.get_collection(SHARDED_COLLECTION))
    values = var_list.values() if isinstance(var_list, dict) else var_list
    return any(shard_of(v) is not None for v in tf.nest.flatten(list(values)))


class _AnySaver(type):
    """``isinstance(saver, tf.compat.v1.train.Saver)`` under ``scope()`` holds for every Saver, as outside it."""

    def __instancecheck__(cls, instance):
        if cls.__dict__.get("_stands_for_every_saver"):
            return isinstance(instance, saver_lib.Saver)
        return super().__instancecheck__(instance)


class UserSaver(saver_lib.Saver, metaclass=_AnySaver):
    """``tf.compat.v1.train.Saver`` under ``scope()``: a :class:`collective.checkpoint.Saver` where tables are saved.

    A plain Saver restoring a logical checkpoint into a table would make each
    worker's shard the whole table. A Saver made under ``scope()`` whose
    var_list (given, or the default: every saveable) holds a sharded table or
    a variable derived from one (an EMA shadow, ``zeros_like(table)``) is
    therefore a :class:`collective.checkpoint.Saver` with the same arguments,
    ``{name: variable}`` var_lists such as
    ``ExponentialMovingAverage.variables_to_restore()`` included: it restores
    each worker's rows of the logical tensors, under any number of workers,
    and saves whole tables (all workers call ``save`` together). Any other
    Saver, and every Saver of an export graph (whole tables there), is
    TensorFlow's.
    """

    _stands_for_every_saver = True

    def __new__(cls, *args, **kwargs):
        if cls is not UserSaver:  # a user's subclass of tf.compat.v1.train.Saver
            return super().__new__(cls)
        bound = _SAVER_PARAMETERS.bind(None, *args, **kwargs).arguments
        bound.pop("self", None)
        bound.update(bound.pop("kwargs", {}))
        if (not tf.executing_eagerly() and not modes.is_exporting() and bound.get("saver_def") is None
                and _holds_sharded_tables(bound.get("var_list"))):
            return Saver(**bound)
        return saver_lib.Saver(*args, **kwargs)
