"""``strategy.estimator(...)``: a TensorFlow Estimator that trains on N workers.

:class:`CollectiveEstimator` wraps ``tf.compat.v1.estimator.Estimator``
(whose public methods subclasses may not override) and has its methods:
``train``, ``evaluate``, ``predict``, ``export_saved_model`` and
``train_and_evaluate(train_spec, eval_spec)``. On every worker, with the same
``model_dir`` (worker 0 makes a temporary one for all when none is given):

- Input: ``input_fn`` returns this worker's share as a batched
  ``tf.data.Dataset`` (read it with ``collective.data`` readers, or take an
  ``input_context`` argument and ``dataset.shard(ctx.num_input_pipelines,
  ctx.input_pipeline_id)``, or build the estimator with
  ``shard_input=True`` to have every N-th batch kept). The dataset is padded
  with empty batches and all workers stop together in the first step where
  none has data (:mod:`collective.integration.sync`), so uneven shares never hang.
- Training: the loss Estimator logs and returns is the mean over the
  workers that had data in the step. Checkpoints: every worker calls the
  checkpoint saver at the same steps (:class:`collective.integration.session.CheckpointSaverHook`;
  ``save_checkpoints_secs`` is agreed on by all workers after each step).
  Incremental checkpoints (deltas) between them: ``incremental_save_steps``
  or ``incremental_save_secs`` here, or an
  :class:`~collective.integration.incremental.IncrementalSaverHook` in the
  ``EstimatorSpec``'s ``training_hooks`` or ``training_chief_hooks`` (saving
  hooks among the chief hooks run on every worker); ``train`` then resumes
  from the newest complete chain. ``evaluate`` and ``predict`` restore the
  newest complete step (:func:`collective.checkpoint.latest_incremental_checkpoint`)
  unless given ``checkpoint_path``; ``export_saved_model`` exports full checkpoints only.
- Evaluation: ``tf.compat.v1.metrics`` variables (loss mean, AUC, accuracy,
  the user's ``eval_metric_ops``) are summed over workers before the final
  values are read, so every worker returns the metrics of all workers' data.
- Prediction: every worker yields the predictions of its own input.
- Only rank 0 writes summaries, event files and Estimator's logs.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
from typing import Any, Callable, Iterator, Optional

import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

from collective import checkpoint, comm, context
from collective.checkpoint import manifest
from collective.integration import hooks as hooks_lib, session as session_lib, sync
from collective.integration.incremental import IncrementalSaverHook
from collective.runtime import heartbeat, preemption
from collective.embedding import hash_table, tables
from collective.tf_internals import estimator_lib, function_utils, patches

logger = logging.getLogger(__name__)
ModeKeys = tf.estimator.ModeKeys


def build_estimator(strategy, model_fn, model_dir, config=None, params=None, *, shard_input: bool = False,
                    throughput_every_n_steps: Optional[int] = None, incremental_save_steps: Optional[int] = None,
                    incremental_save_secs: Optional[float] = None, warm_start_from=None) -> "CollectiveEstimator":
    """The Estimator ``CollectiveStrategy.estimator`` returns (see :class:`CollectiveEstimator`)."""
    return CollectiveEstimator(strategy, model_fn, model_dir, config=config, params=params,
                               shard_input=shard_input, throughput_every_n_steps=throughput_every_n_steps,
                               incremental_save_steps=incremental_save_steps,
                               incremental_save_secs=incremental_save_secs, warm_start_from=warm_start_from)


def shared_temporary_model_dir() -> str:
    """A temporary model directory made by worker 0 and used by every worker (``model_dir=None``).

    ``tf.estimator.Estimator`` makes a temporary directory per process when no
    model_dir is given; here all workers must share one, so worker 0 makes it
    and sends its path. On several hosts it must be on a shared file system:
    pass a model_dir there.
    """
    path = tempfile.mkdtemp(prefix="collective_model_") if comm.rank() == 0 else None
    path = comm.broadcast_string(path)
    logger.warning("model_dir is not set: every worker uses the temporary folder %s made by worker 0 "
                    "(on several hosts, pass a model_dir on a shared file system)", path)
    return path


class CollectiveEstimator:
    """An Estimator whose methods run synchronously on every worker.

    Args:
      strategy: the ``CollectiveStrategy``.
      model_fn: an Estimator ``model_fn``; it must return an ``EstimatorSpec``
        for every mode it is called with.
      model_dir: the directory every worker shares.
      config: a ``tf.estimator.RunConfig`` (``model_dir`` may be left unset).
      params: passed to ``model_fn`` and ``input_fn``.
      shard_input: keep every N-th element (batch) of the ``input_fn``'s
        dataset on each worker; leave False when ``input_fn`` reads its share.
      throughput_every_n_steps: interval of the default
        :class:`collective.integration.hooks.ThroughputHook` (default
        ``config.log_step_count_steps``, else 100).
      incremental_save_steps / incremental_save_secs: write an incremental
        checkpoint (delta) this often while training, on every worker
        (at most one of them; see docs/checkpoints.md). Full checkpoints
        follow ``config`` as usual; without one yet, the first delta due
        writes a full checkpoint instead.
      warm_start_from: as ``tf.estimator.Estimator``'s (a checkpoint or
        model_dir, or a ``tf.estimator.WarmStartSettings``); sharded tables
        load their rows of the stored logical tables
        (:mod:`collective.integration.warm_start`).
    """

    def __init__(self, strategy, model_fn: Callable, model_dir: Optional[str], config=None, params=None, *,
                 shard_input: bool = False, throughput_every_n_steps: Optional[int] = None,
                 incremental_save_steps: Optional[int] = None, incremental_save_secs: Optional[float] = None,
                 warm_start_from=None):
        if incremental_save_steps is not None and incremental_save_secs is not None:
            raise ValueError("strategy.estimator: give at most one of incremental_save_steps and "
                             f"incremental_save_secs (got {incremental_save_steps!r} and {incremental_save_secs!r})")
        self._incremental = (incremental_save_steps, incremental_save_secs)
        self._strategy = strategy
        self._user_model_fn = model_fn
        self._shard_input = shard_input
        config = config if config is not None else tf.estimator.RunConfig()
        if model_dir is None and config.model_dir is None:
            model_dir = shared_temporary_model_dir()
        self._user_config = config
        self._throughput_every = (throughput_every_n_steps or config.log_step_count_steps or 100)
        # Estimator's own default config when none is given, pinned to this worker's GPU.
        worker_config = config.replace(session_config=context.session_config(
            config.session_config if config.session_config is not None else _default_session_config()))
        if comm.rank() != 0:
            # Estimator and MonitoredTrainingSession add summary, step-counter and logging hooks from these.
            worker_config = worker_config.replace(save_summary_steps=0, log_step_count_steps=None)
        self._estimator = _Estimator(
            model_fn=self._model_fn, model_dir=model_dir, config=worker_config, params=params,
            warm_start_from=warm_start_from)

    # ------------------------------------------------------------ properties

    @property
    def model_dir(self) -> str:
        return self._estimator.model_dir

    @property
    def config(self):
        return self._estimator.config

    @property
    def params(self):
        return self._estimator.params

    @property
    def model_fn(self) -> Callable:
        return self._user_model_fn

    @property
    def estimator(self) -> tf.compat.v1.estimator.Estimator:
        """The wrapped TensorFlow Estimator (its model_fn and input_fns are the synchronised ones)."""
        return self._estimator

    def __getattr__(self, name: str) -> Any:
        # get_variable_value, get_variable_names, latest_checkpoint, eval_dir, ...
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._estimator, name)

    # ------------------------------------------------------------ methods

    def train(self, input_fn, hooks=None, steps=None, max_steps=None, saving_listeners=None):
        """``Estimator.train`` on every worker's share; returns ``self``."""
        try:
            with self._running():
                self._estimator.train(self._input_fn(input_fn), hooks=hooks, steps=steps, max_steps=max_steps,
                                      saving_listeners=saving_listeners)
        finally:
            preemption.uninstall()  # after an error too, which skips the checkpoint hook's end
        return self

    def evaluate(self, input_fn, steps=None, hooks=None, checkpoint_path=None, name=None):
        """``Estimator.evaluate`` over all workers' data; every worker returns the same metrics.

        Without ``checkpoint_path`` it evaluates the newest complete step: the
        newest delta chained to the latest full checkpoint, else that one.
        """
        with self._running(), heartbeat.phase("evaluate"):
            return self._estimator.evaluate(self._input_fn(input_fn), steps=steps, hooks=hooks,
                                            checkpoint_path=checkpoint_path or self._newest_step(), name=name)

    def predict(self, input_fn, predict_keys=None, hooks=None, checkpoint_path=None,
                yield_single_examples=True) -> Iterator:
        """``Estimator.predict``: yields this worker's predictions. Every worker must exhaust the generator.

        Without ``checkpoint_path`` it restores the newest complete step, as :meth:`evaluate` does.
        """
        with self._running(), heartbeat.phase("evaluate"):
            yield from self._estimator.predict(self._input_fn(input_fn), predict_keys=predict_keys, hooks=hooks,
                                               checkpoint_path=checkpoint_path or self._newest_step(),
                                               yield_single_examples=yield_single_examples)

    def export_saved_model(self, export_dir_base, serving_input_receiver_fn, assets_extra=None, as_text=False,
                           checkpoint_path=None, experimental_mode=ModeKeys.PREDICT):
        """Rank 0 writes a SavedModel with whole tables that plain TensorFlow serves (``collective.integration.export``).

        Every worker calls it; returns the export directory (bytes) on rank 0, None on the others.
        """
        from collective.integration import export  # pylint: disable=import-outside-toplevel

        if experimental_mode != ModeKeys.PREDICT:
            raise ValueError(f"export_saved_model exports the PREDICT graph only; got experimental_mode="
                             f"{experimental_mode!r}")
        checkpoint_path = checkpoint_path or self.latest_checkpoint()
        if not checkpoint_path:
            raise ValueError(f"no checkpoint in model_dir {self.model_dir!r} to export; train first or pass "
                             "checkpoint_path")
        if manifest.is_delta(checkpoint_path):
            raise ValueError(f"export_saved_model exports full checkpoints; {checkpoint_path} is an incremental "
                             "checkpoint (a delta). Pass a full one (estimator.latest_checkpoint()), or restore the "
                             "chain and save it whole (collective.checkpoint.Saver.save) first")
        with self._running(), heartbeat.phase("export"):
            with _building_model():
                return export.export_estimator(self._user_model_fn, self.params, self.config, export_dir_base,
                                               serving_input_receiver_fn, checkpoint_path, assets_extra=assets_extra,
                                               as_text=as_text)

    def _newest_step(self) -> Optional[str]:
        """The newest complete checkpoint of model_dir: its newest delta chained to the latest full one, else that."""
        return checkpoint.latest_incremental_checkpoint(self.model_dir)

    def train_and_evaluate(self, train_spec, eval_spec):
        """Trains to ``train_spec.max_steps``, then evaluates once and runs the exporters.

        Unlike ``tf.estimator.train_and_evaluate`` there is no evaluation
        during training (its ``throttle_secs`` is a per-process clock).
        Returns ``(eval_result, export_results)`` like TensorFlow's.
        """
        self.train(train_spec.input_fn, hooks=list(train_spec.hooks), max_steps=train_spec.max_steps,
                   saving_listeners=list(getattr(train_spec, "saving_listeners", ()) or ()) or None)
        result = self.evaluate(eval_spec.input_fn, steps=eval_spec.steps, hooks=list(eval_spec.hooks),
                               name=eval_spec.name)
        exports = []
        checkpoint = self.latest_checkpoint()
        for exporter in eval_spec.exporters or ():
            base = tf.io.gfile.join(self.model_dir, "export", exporter.name)
            exports.append(exporter.export(self, base, checkpoint, result, is_the_final_export=True))
        return result, exports

    # ------------------------------------------------------------ internals

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        with self._strategy.scope(), _rank0_outputs(), patches.applied(patches.registration(estimator_lib, "_verify_and_create_loss_metric")), _every_worker_calls():
            yield

    def _input_fn(self, input_fn: Callable) -> Callable:
        accepted = function_utils.fn_args(input_fn)
        shard_input = self._shard_input

        def synchronised_input_fn(mode, params, config):
            kwargs = {}
            for key, value in (("mode", mode), ("params", params), ("config", config)):
                if key in accepted:
                    kwargs[key] = value
            if "input_context" in accepted:
                kwargs["input_context"] = tf.distribute.InputContext(
                    num_input_pipelines=comm.world_size(), input_pipeline_id=comm.rank(),
                    num_replicas_in_sync=comm.world_size())
            result = input_fn(**kwargs)
            if not isinstance(result, tf.data.Dataset):
                if comm.world_size() > 1:
                    logger.warning("input_fn returned tensors, not a tf.data.Dataset: workers are not "
                                   "synchronised at the end of their input, so unequal shares will hang")
                return result
            if shard_input:
                result = sync.shard(result)
            return sync.pad_with_empty_batches(result)

        return synchronised_input_fn

    def _model_fn(self, features, labels, mode, params, config):
        step = None
        if sync.has_sync_keys(features):
            step = sync.synchronise(features, labels)
            features, labels = step.features, step.labels
        accepted = function_utils.fn_args(self._user_model_fn)
        kwargs = {}
        if "labels" in accepted:
            kwargs["labels"] = labels
        elif labels is not None:
            raise ValueError("model_fn does not take labels but input_fn returned labels; "
                             "add a labels argument to model_fn or return features only")
        for key, value in (("mode", mode), ("params", params), ("config", config)):
            if key in accepted:
                kwargs[key] = value
        with hash_table.for_mode(mode):  # evaluation and prediction do not grow hash-table vocabularies
            spec = self._user_model_fn(features=features, **kwargs)
        if spec is None:
            raise ValueError(f"model_fn returned None for mode {mode!r}; return a tf.estimator.EstimatorSpec "
                             "for every mode (TRAIN, EVAL and PREDICT) the estimator is used in")
        scaffold = spec.scaffold
        if scaffold.saver is None:
            scaffold = tf.compat.v1.train.Scaffold(saver=_checkpoint_saver(self._user_config),
                                                   copy_from_scaffold=scaffold)
        if mode == ModeKeys.TRAIN:
            return self._train_spec(spec, step, scaffold)
        if mode == ModeKeys.EVAL:
            loss = spec.loss
            if step is not None:
                # Estimator's loss metric is a mean over batches: a worker's empty batch must not count
                # (see loss_metric_weighted_by_data).
                loss = tf.where(step.has_data, loss, tf.zeros_like(loss))
                tf.compat.v1.add_to_collection(_EVAL_HAS_DATA, step.has_data)
            return spec._replace(loss=loss, scaffold=scaffold,
                                 evaluation_hooks=list(spec.evaluation_hooks) + [hooks_lib.GlobalMetricsHook()])
        return spec._replace(scaffold=scaffold)

    def _train_spec(self, spec, step, scaffold):
        if step is not None:
            # Mean of the per-worker losses over the workers that had data in this step.
            has = tf.cast(step.has_data, spec.loss.dtype)
            sums = comm.allreduce(tf.stack([tf.where(step.has_data, spec.loss, tf.zeros_like(spec.loss)), has]),
                                  "sum")
            loss = sums[0] / tf.maximum(sums[1], 1)
            samples = step.global_rows
        else:
            loss = comm.allreduce(spec.loss, "average")
            samples = None
        # Saving hooks run on every worker (each saves its own rows), chief hooks or not; deltas after full saves.
        chief_hooks = [h for h in spec.training_chief_hooks if not _saves(h)]
        saving = [h for h in spec.training_chief_hooks if _saves(h)]
        hooks = [h for h in spec.training_hooks if not isinstance(h, IncrementalSaverHook)]
        hooks += [h for h in saving if not isinstance(h, IncrementalSaverHook)]
        hooks.append(hooks_lib.ThroughputHook(self._throughput_every, samples=samples, loss=loss))
        hooks += [heartbeat.HeartbeatHook(), hooks_lib.PlanHook()]
        config = self._user_config
        if config.save_checkpoints_secs or config.save_checkpoints_steps:
            hooks.append(session_lib.CheckpointSaverHook(
                self._estimator.model_dir, save_secs=config.save_checkpoints_secs,
                save_steps=config.save_checkpoints_steps, scaffold=scaffold,
                save_graph_def=config.checkpoint_save_graph_def))
        hooks += [h for h in list(spec.training_hooks) + saving if isinstance(h, IncrementalSaverHook)]
        steps, secs = self._incremental
        if steps is not None or secs is not None:
            hooks.append(IncrementalSaverHook(self._estimator.model_dir, incremental_save_steps=steps,
                                              incremental_save_secs=secs, scaffold=scaffold))
        if not tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVERS):
            # Hooks made in model_fn without a saver or scaffold find the one this graph restores and saves with.
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, scaffold.saver)
        return spec._replace(loss=loss, training_hooks=hooks, training_chief_hooks=chief_hooks, scaffold=scaffold)


def _saves(hook) -> bool:
    """Whether ``hook`` writes checkpoints that every worker must write together (collective's saving hooks)."""
    return isinstance(hook, (session_lib.CheckpointSaverHook, IncrementalSaverHook))


class _Estimator(tf.compat.v1.estimator.Estimator):
    """Estimator whose global-step read runs no collective.

    Estimator builds the model under TensorFlow's global-step read, which
    evaluates the step's initial value: under ``scope()`` rank 0's value by
    broadcast, so a hook reading the step in a run of its own on one rank
    (only rank 0 has summary and step-counter hooks) would hang the job.
    """

    def _create_and_assert_global_step(self, graph):
        step = super()._create_and_assert_global_step(graph)
        session_lib.ensure_global_step_read(graph)
        return step


def refuse_plain_estimator(estimator, features, labels, mode, config):
    """``Estimator._call_model_fn`` inside ``scope()``: only ``strategy.estimator(...)`` builds a model there.

    A plain Estimator would run on every worker as if it were alone: each one
    writes its own shards of the tables under their whole names into the same
    checkpoint files, and restoring them fails later with a misleading error.
    """
    if isinstance(estimator, _Estimator):
        with _building_model():
            return patches.original(estimator_lib.Estimator, "_call_model_fn")(estimator, features, labels, mode,
                                                                               config)
    if not getattr(_building, "depth", 0):  # a canned estimator's model_fn inside ours is a model_fn like any other
        raise TypeError(
            f"a plain {type(estimator).__module__}.{type(estimator).__name__} cannot build its model inside "
            "CollectiveStrategy.scope(): its checkpoints would hold each worker's shards under the whole tables' "
            "names. Use strategy.estimator(model_fn, model_dir, config=..., params=...) instead (for a canned "
            "estimator: strategy.estimator(canned.model_fn, ...)), or build the Estimator outside scope() to "
            "train in one process")
    if tables.inside_embedding_scope():
        raise TypeError(
            f"the model_fn of {type(estimator).__name__} cannot run inside embedding_scope(): every 2-D variable "
            "made there becomes a sharded table, its dense kernels included. Pass it without embedding_scope(): "
            "strategy.estimator(canned.model_fn, model_dir) trains it on every worker with its embedding columns "
            "replicated (their gradients averaged like the dense layers'). To shard the embedding tables, write "
            "a model_fn that makes only the embedding columns' tables inside embedding_scope() (docs/estimator.md)")
    return patches.original(estimator_lib.Estimator, "_call_model_fn")(estimator, features, labels, mode, config)


_building = threading.local()


@contextlib.contextmanager
def _building_model() -> Iterator[None]:
    """Marks the block as building a CollectiveEstimator's model (its model_fn may call a canned one's)."""
    _building.depth = getattr(_building, "depth", 0) + 1
    try:
        yield
    finally:
        _building.depth -= 1


class WorkersNotInStepError(RuntimeError):
    """A collective Estimator call ran on some workers only."""


@contextlib.contextmanager
def _every_worker_calls() -> Iterator[None]:
    """Turns Horovod's "has been shut down" into what went wrong: a call made on some workers only."""
    try:
        yield
    except tf.errors.OpError as err:
        if "shut down" not in str(err):
            raise
        raise WorkersNotInStepError(
            f"rank {comm.rank()}: the other workers left while this one was in a collective Estimator call. train, "
            "evaluate and predict look up sharded tables together: call them on every worker (each with its own "
            "input; predict yields each worker's own predictions). To predict in one process, export a SavedModel "
            "(export_saved_model, on every worker) and load it with plain TensorFlow.") from err


def _default_session_config() -> tf.compat.v1.ConfigProto:
    """The config ``tf.estimator.Estimator`` uses when ``RunConfig.session_config`` is None."""
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    config.graph_options.rewrite_options.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    return config


def _checkpoint_saver(config) -> checkpoint.Saver:
    """The saver every worker calls: collective's logical checkpoint saver."""
    return checkpoint.Saver(max_to_keep=config.keep_checkpoint_max,
                            keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours,
                            save_relative_paths=True)


def loss_metric_weighted_by_data(eval_metric_ops, loss, distribution=None):
    """Estimator's loss metric (a mean of batch losses), leaving out the empty batches of padded input."""
    flags = tf.compat.v1.get_collection(_EVAL_HAS_DATA)
    if not flags or distribution is not None:
        return patches.original(estimator_lib, "_verify_and_create_loss_metric")(eval_metric_ops, loss, distribution)
    if _LOSS_KEY in eval_metric_ops:
        raise ValueError(f'eval_metric_ops may not contain "{_LOSS_KEY}": Estimator defines that metric')
    eval_metric_ops[_LOSS_KEY] = tf.compat.v1.metrics.mean(loss, weights=tf.cast(flags[-1], loss.dtype))
    return eval_metric_ops


_EVAL_HAS_DATA = "collective_eval_has_data"
_LOSS_KEY = "loss"


def write_nothing(*args, **kwargs) -> None:  # pylint: disable=unused-argument
    """Estimator's summary writers on ranks other than 0."""


_SUMMARY_WRITERS = ("_write_dict_to_summary", "_write_checkpoint_path_to_summary")


@contextlib.contextmanager
def _rank0_outputs() -> Iterator[None]:
    """On ranks other than 0: TensorFlow's INFO logs and Estimator's evaluation summaries are dropped."""
    if comm.rank() == 0:
        yield
        return
    tf_logger = logging.getLogger("tensorflow")
    level = tf_logger.level
    tf_logger.setLevel(max(level, logging.WARNING))
    try:
        with patches.applied(*[patches.registration(estimator_lib, name) for name in _SUMMARY_WRITERS]):
            yield
    finally:
        tf_logger.setLevel(level)
