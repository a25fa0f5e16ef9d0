"""``IncrementalSaverHook``: incremental checkpoints (deltas) between full ones, on every worker.

    hooks = [IncrementalSaverHook("model_dir", incremental_save_steps=100)]
    # or, inside CollectiveStrategy.scope(), DeepRec's argument:
    tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir="model_dir", save_checkpoint_steps=10000,
                                                save_incremental_checkpoint_secs=60)

Every worker runs the hook: it calls
:meth:`collective.checkpoint.Saver.save_incremental` at the same steps on
all of them (with ``incremental_save_secs`` they agree after each step with
one scalar allreduce, as :class:`~collective.integration.session.CheckpointSaverHook`
does). A delta chains to the last full checkpoint the saver wrote or
restored; when there is none yet, the hook writes a full one first. A step
that already has a checkpoint (a full save of the same step) is not saved
again. When the session starts, the saver restores the newest complete
chain of ``checkpoint_dir`` (the latest full checkpoint plus its deltas)
instead of the full checkpoint alone.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import tensorflow as tf

from collective import comm
from collective.checkpoint import Saver
from collective.checkpoint.saver import default_saver
from collective.runtime import heartbeat
from collective.tf_internals import basic_session_run_hooks

logger = logging.getLogger("collective.integration.incremental")


class IncrementalSaverHook(tf.compat.v1.train.SessionRunHook):
    """Writes a delta every ``incremental_save_steps`` steps or ``incremental_save_secs`` seconds (one of them).

    Args:
      checkpoint_dir: the model_dir; deltas are ``<checkpoint_dir>/<checkpoint_basename>-<step>.delta``.
      incremental_save_steps / incremental_save_secs: how often.
      saver: a :class:`collective.checkpoint.Saver` (default: the graph's, as ``Scaffold`` picks it).
      checkpoint_basename: as ``CheckpointSaverHook``'s.
      scaffold: whose saver to use when ``saver`` is None.
    """

    def __init__(self, checkpoint_dir: str, incremental_save_steps: Optional[int] = None,
                 incremental_save_secs: Optional[float] = None, saver: Optional[Saver] = None,
                 checkpoint_basename: str = "model.ckpt", scaffold=None):
        if (incremental_save_steps is None) == (incremental_save_secs is None):
            raise ValueError("IncrementalSaverHook: give exactly one of incremental_save_steps and "
                             f"incremental_save_secs (got {incremental_save_steps!r} and {incremental_save_secs!r})")
        self._save_path = os.path.join(checkpoint_dir, checkpoint_basename)
        self._saver, self._scaffold = saver, scaffold
        self._timer = basic_session_run_hooks.SecondOrStepTimer(every_secs=incremental_save_secs,
                                                                every_steps=incremental_save_steps)
        self._by_time = incremental_save_secs is not None

    def _get_saver(self) -> Saver:
        saver = self._saver or (self._scaffold.saver if self._scaffold is not None else None) or default_saver()
        if not isinstance(saver, Saver):
            raise TypeError("IncrementalSaverHook needs a collective.checkpoint.Saver (the default inside "
                            f"CollectiveStrategy.scope()), got {saver!r}")
        return saver

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()
        if self._global_step is None:
            raise RuntimeError("Global step should be created to use IncrementalSaverHook.")
        if self._by_time:
            self._due = tf.compat.v1.placeholder(tf.int32, [], name="incremental_checkpoint_due")
            self._any_due = comm.allreduce_max(self._due)
        # Made now (the graph is not final yet), the Scaffold picks the same saver; its restore resumes chains.
        self._get_saver().resume_chains = True

    def after_create_session(self, session, coord):
        self._timer.update_last_triggered_step(session.run(self._global_step))

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        due = self._timer.should_trigger_for_step(run_values.results + 1)
        if self._by_time:
            due = bool(run_context.session.run(self._any_due, {self._due: int(due)}))
        if not due:
            return
        step = run_context.session.run(self._global_step)
        if not self._by_time and not self._timer.should_trigger_for_step(step):
            return
        self._timer.update_last_triggered_step(step)
        self._save(run_context.session, step)

    def _save(self, session, step: int) -> None:
        saver = self._get_saver()
        chain = saver.last_chain()
        with heartbeat.phase("save"):
            if chain is None:
                logger.info("No full checkpoint to chain deltas to yet: saving one for step %d.", step)
                saver.save(session, self._save_path, global_step=step)
            elif chain.step == step or os.path.normpath(chain.base) == os.path.normpath(
                    saver.checkpoint_file(self._save_path, step)):
                return  # this step is saved already
            else:
                saver.save_incremental(session, self._save_path, global_step=step)
