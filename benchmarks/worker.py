"""Benchmark runs' worker: ``python -m collective.launch -n N -m benchmarks.worker SPECS DATA OUT_DIR``.

SPECS is a JSON file with a list of runs (see :func:`benchmarks.config.matrix`)
run one after another in this process; DATA is the Parquet directory every
run reads (:mod:`collective.data`, each worker its own share of every global
batch, repeated as long as the run needs). For run ``i`` each worker writes
``OUT_DIR/<i>/rank<r>.json``: step times, losses, bytes sent, memory.

Every mode trains the same model (:mod:`benchmarks.models`) end to end: the
Parquet input pipeline, forward, backward and Adagrad, written as its users
write it:

  estimator   stock ``tf.estimator.Estimator`` (one process), default RunConfig:
              what users of feature columns run today.
  tf_mts      plain TensorFlow under ``tf.compat.v1.train.MonitoredTrainingSession``.
  hvd_dp      Horovod data parallelism: tables replicated on every worker,
              ``hvd.DistributedOptimizer`` (sparse gradients allgathered,
              dense ones allreduced), ``BroadcastGlobalVariablesHook``.
              Horovod's own ops are not counted by ``collective.comm``: the
              step adds to the same counter what they send under its byte model.
  estimator_tuned, tf_mts_tuned, hvd_dp_tuned
              the same programs with the one line of session config a user who
              profiles them adds (:func:`tuned`): Grappler's arithmetic
              optimizer off, whose SimplifyEmbeddingLookupStage makes every
              sparse lookup read its whole table.
  hvd_dp_dense
              ``hvd_dp_tuned`` with ``sparse_as_dense=True``: the tables'
              gradients allreduced dense (Horovod's advice for small tables).
  ceiling     the same model with its lookups replaced by constant vectors
              (``embedding_api="constant"``): one process at N = 1, Horovod
              data parallelism of the dense layers at N > 1, tuned. The
              embedding-free limit of every mode.
  replicated, hb, sok
              ``CollectiveStrategy(mode).scope()`` around the same program,
              tables in ``embedding_scope()``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

from benchmarks import config as configs
from benchmarks import models
from benchmarks.tracing import StepTracer, TableReads
from collective import comm, context
from collective.byte_model import sent_bytes
from collective.runtime import devices
from collective.embedding.table import shard_of
from datasets import schema

logger = logging.getLogger("benchmarks.worker")
COLLECTIVE_MODES = ("replicated", "hb", "hb_packed", "sok")
MODES = configs.BASELINES + COLLECTIVE_MODES
_COLUMNS = frozenset(schema.CATEGORICAL)


def _nbytes(t) -> tf.Tensor:
    return tf.size(t, out_type=tf.int64) * t.dtype.size


def horovod_bytes(local_grads, n: int, sparse_as_dense: bool = False) -> tf.Tensor:
    """Bytes this worker sends for ``hvd.DistributedOptimizer``'s gradient exchange, under comm's byte model."""
    total = tf.constant(0, tf.int64)
    for grad, var in local_grads:
        if grad is None:
            continue
        if isinstance(grad, tf.IndexedSlices) and sparse_as_dense:
            total += sent_bytes("allreduce", _variable_bytes(var), n)
        elif isinstance(grad, tf.IndexedSlices):
            total += sent_bytes("allgather", _nbytes(grad.values) + _nbytes(grad.indices), n)
        else:
            total += sent_bytes("allreduce", _nbytes(grad), n)
    return total


def _is_embedding(var: tf.Variable) -> bool:
    """A table or its optimizer slot: sharded, a feature column's ``embedding_weights``, or named after a column."""
    if shard_of(var) is not None or "embedding_weights" in var.name:
        return True
    return any(part in _COLUMNS for part in var.name.split(":")[0].split("/"))


def _variable_bytes(var: tf.Variable) -> int:
    return int(var.shape.num_elements()) * var.dtype.size


def table_variables() -> List[tf.Variable]:
    """This worker's tables and their optimizer slots in the default graph."""
    graph = tf.compat.v1.get_default_graph()
    return [v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES) if _is_embedding(v)]


def table_reads(spec: Dict[str, Any]) -> TableReads:
    """Counts the whole-table reads of the last warm-up step (outside the timed steps)."""
    return TableReads(int(spec["warmup"]) - 1, lambda: {v.op.name for v in table_variables()})


def variable_figures() -> Dict[str, Any]:
    """This worker's table bytes (tables and their optimizer slots), dense variable sizes and packing groups
    (docs/packing.md) in the default graph."""
    graph = tf.compat.v1.get_default_graph()
    tables = table_variables()
    dense = [v for v in graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES) if not _is_embedding(v)]
    from collective.embedding import packed_tables  # pylint: disable=import-outside-toplevel

    return {"embedding_bytes": sum(_variable_bytes(v) for v in tables),
            "dense_param_bytes": [_variable_bytes(v) for v in dense],
            "packing_groups": sum(packed_tables.group_of(v) is not None
                                  for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES))}


def worker_batch(spec: Dict[str, Any], n: int) -> int:
    """Rows per worker per step: the global batch split evenly (the remainder is dropped)."""
    return int(spec["global_batch"]) // n


def input_fn(spec: Dict[str, Any], data_dir: str, rank: int, n: int) -> tf.data.Dataset:
    """This worker's batches of ``data_dir``: ``(features, labels)``, repeated forever, static batch shape."""
    import collective.data as cd  # pylint: disable=import-outside-toplevel

    return cd.parquet_dataset(data_dir, worker_batch(spec, n), fields=list(schema.COLUMNS), label=schema.LABEL,
                              rank=rank, world_size=n, num_epochs=None, drop_remainder=True)


def _optimizer(spec: Dict[str, Any]) -> tf.compat.v1.train.Optimizer:
    return tf.compat.v1.train.AdagradOptimizer(float(spec["learning_rate"]))


def model_spec(spec: Dict[str, Any]) -> Dict[str, Any]:
    """The parameters the model is built with: the ceiling's lookups are constants."""
    return dict(spec, api="constant") if spec["mode"] == configs.CEILING else spec


def build_train(spec: Dict[str, Any], features, labels):
    """(train_op, loss, init ops to run after initialisation) for the session modes."""
    mode, n = spec["mode"], comm.world_size()
    builder = models.get(spec["model"])
    global_step = tf.compat.v1.train.get_or_create_global_step()
    loss, _ = builder(features, labels, model_spec(spec), mode in COLLECTIVE_MODES)
    opt = _optimizer(spec)
    if mode not in configs.DATA_PARALLEL and not (mode == configs.CEILING and n > 1):
        return opt.minimize(loss, global_step=global_step), loss, []
    import horovod.tensorflow as hvd  # pylint: disable=import-outside-toplevel

    hvd.init()
    dense = mode == "hvd_dp_dense"
    local = opt.compute_gradients(loss)
    distributed = hvd.DistributedOptimizer(opt, sparse_as_dense=dense)
    averaged = distributed.compute_gradients(loss)
    count = comm.bytes_counter().assign_add(horovod_bytes(local, n, dense), read_value=False)
    with tf.control_dependencies([count]):
        train_op = distributed.apply_gradients(averaged, global_step=global_step)
    return train_op, loss, [hvd.BroadcastGlobalVariablesHook(0)]


class StepTimer(tf.compat.v1.train.SessionRunHook):
    """Wall time between consecutive steps' ends, the loss of each step, and the byte counter around the timed steps.

    Steps ``0 .. warmup-1`` warm up; the next ``timed`` steps are timed. A
    step's time is the interval between its ``after_run`` and the previous
    one's: everything the step costs the program that runs it (the session
    call, the input pipeline, the hooks: the Estimator's summaries and step
    counter included). The byte counter is read between steps, outside the
    timed intervals.
    """

    def __init__(self, loss: tf.Tensor, warmup: int, timed: int):
        if warmup < 1:
            raise ValueError(f"warmup={warmup}: at least one warm-up step is needed to start the first interval")
        self._loss, self._warmup, self._timed = loss, warmup, timed
        self.times: List[float] = []
        self.losses: List[float] = []
        self.bytes_before = self.bytes_after = 0
        self._last = 0.0
        self._step = 0
        self._counter = comm.bytes_counter()
        self.tracers: List[StepTracer] = []  # set by the runner when the spec asks for a trace
        self.reads: Optional[TableReads] = None  # set by the runner

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._loss)

    def after_run(self, run_context, run_values):
        now = time.perf_counter()
        k, first, last = self._step, self._warmup, self._warmup + self._timed - 1
        self._step += 1
        if first <= k <= last:
            self.times.append(now - self._last)
            self.losses.append(float(run_values.results))
        if k == first - 1:
            self.bytes_before = int(run_context.session.run(self._counter))
            now = time.perf_counter()
        if k == last:
            self.bytes_after = int(run_context.session.run(self._counter))
            run_context.request_stop()
        self._last = now


def tuned(config: tf.compat.v1.ConfigProto) -> tf.compat.v1.ConfigProto:
    """``config`` with the line a user who profiles a stock sparse model adds: Grappler's arithmetic optimizer
    off (its SimplifyEmbeddingLookupStage reads whole tables; TensorFlow cannot turn that stage off alone)."""
    from tensorflow.core.protobuf import rewriter_config_pb2  # pylint: disable=import-outside-toplevel

    config.graph_options.rewrite_options.arithmetic_optimization = rewriter_config_pb2.RewriterConfig.OFF
    return config


def session_config(mode: str) -> tf.compat.v1.ConfigProto:
    """The session config of ``mode``: threads from the environment, this worker's GPU; the baselines as
    shipped keep Grappler's defaults, the tuned ones and the ceiling get :func:`tuned`, and collective's modes
    :func:`collective.context.session_config` (which makes the same change)."""
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=int(os.environ.get("TF_NUM_INTRAOP_THREADS", 0)),
        inter_op_parallelism_threads=int(os.environ.get("TF_NUM_INTEROP_THREADS", 0)))
    if mode in COLLECTIVE_MODES:
        return context.session_config(config)
    config = devices.session_config(config, context.get().placement)
    return config if mode in configs.AS_SHIPPED else tuned(config)


def tracers(spec: Dict[str, Any]) -> List[StepTracer]:
    """A :class:`StepTracer` of the first ``trace_steps`` timed steps when the spec asks for one
    (``python -m benchmarks.profile``); none for timed runs."""
    count = int(spec.get("trace_steps", 0))
    return [StepTracer(int(spec["warmup"]), count)] if count > 0 else []


def _run_session(spec: Dict[str, Any], data_dir: str, timer_args) -> Tuple[StepTimer, Dict[str, Any]]:
    """tf_mts, hvd_dp, replicated, hb, sok: the program under ``MonitoredTrainingSession``."""
    r, n = comm.rank(), comm.world_size()
    if spec["mode"] in COLLECTIVE_MODES:
        from collective import CollectiveStrategy  # pylint: disable=import-outside-toplevel
        from collective.embedding import packing  # pylint: disable=import-outside-toplevel

        scope = CollectiveStrategy(configs.backend_of(spec["mode"])).scope()
        packs = packing.using(spec["mode"] in configs.PACKED_MODES)
    else:
        scope, packs = contextlib.nullcontext(), contextlib.nullcontext()
    with scope, packs:
        features, labels = tf.compat.v1.data.make_one_shot_iterator(input_fn(spec, data_dir, r, n)).get_next()
        train_op, loss, hooks = build_train(spec, features, labels)
        timer = StepTimer(loss, *timer_args)
        timer.tracers = tracers(spec)
        timer.reads = table_reads(spec)
        figures = variable_figures()
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks + timer.tracers + [timer.reads, timer],
                                                         config=session_config(spec["mode"]),
                                                         log_step_count_steps=None) as sess:
            while not sess.should_stop():
                sess.run(train_op)
    return timer, figures


def _run_estimator(spec: Dict[str, Any], data_dir: str, timer_args) -> Tuple[StepTimer, Dict[str, Any]]:
    """The stock Estimator: default RunConfig (checkpoints every 10 minutes, summaries every 100 steps)."""
    timers: List[StepTimer] = []
    figures: Dict[str, Any] = {}

    def model_fn(features, labels, mode, params):
        loss, probs = models.get(spec["model"])(features, labels, model_spec(spec), False)
        train_op = _optimizer(spec).minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
        timers.append(StepTimer(loss, *timer_args))
        timers[-1].tracers = tracers(spec)
        timers[-1].reads = table_reads(spec)
        figures.update(variable_figures())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, predictions={"probability": probs},
                                          training_hooks=timers[-1].tracers + [timers[-1].reads, timers[-1]])

    with tempfile.TemporaryDirectory(prefix="bench-estimator-") as model_dir:
        config = tf.estimator.RunConfig(session_config=session_config(spec["mode"]), tf_random_seed=int(spec["seed"]))
        estimator = tf.estimator.Estimator(model_fn, model_dir=model_dir, config=config)
        estimator.train(lambda: input_fn(spec, data_dir, 0, 1), max_steps=timer_args[0] + timer_args[1])
    return timers[-1], figures


def run(spec: Dict[str, Any], data_dir: str, out_dir: str) -> None:
    """Trains and times one configuration on this worker; writes its results."""
    r, n = comm.rank(), comm.world_size()
    if spec["mode"] in configs.SINGLE_PROCESS and n != 1:
        raise ValueError(f"the {spec['mode']} baseline is one process; run it with -n 1, not {n}")
    timed = int(spec["repeats"]) * int(spec["steps"])
    timer_args = (int(spec["warmup"]), timed)
    with tf.Graph().as_default():
        tf.compat.v1.set_random_seed(int(spec["seed"]))
        if spec["mode"] in ("estimator", "estimator_tuned"):
            timer, figures = _run_estimator(spec, data_dir, timer_args)
        else:
            timer, figures = _run_session(spec, data_dir, timer_args)
    steps = int(spec["steps"])
    result = {
        "rank": r,
        "world_size": n,
        "worker_batch": worker_batch(spec, n),
        "step_times": [timer.times[i:i + steps] for i in range(0, len(timer.times), steps)],
        "losses": timer.losses,
        "bytes_sent": timer.bytes_after - timer.bytes_before,
        "bytes_per_step": (timer.bytes_after - timer.bytes_before) / max(timed, 1),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "whole_table_reads": timer.reads.count,
        **figures,
    }
    if timer.tracers:
        result["trace"] = timer.tracers[0].summary()
    with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
        json.dump(result, f)


def main(argv: List[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if len(argv) != 3:
        print("usage: python -m collective.launch -n N -m benchmarks.worker SPECS.json DATA_DIR OUT_DIR",
              file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        specs = json.load(f)
    for spec in specs:
        if spec.get("mode") not in MODES:
            print(f"{argv[0]}: mode {spec.get('mode')!r} is not one of {', '.join(MODES)}", file=sys.stderr)
            return 2
    context.get()
    for i, spec in enumerate(specs):
        out = os.path.join(argv[2], str(i))
        os.makedirs(out, exist_ok=True)
        run(spec, argv[1], out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
