"""Session hooks for synchronous training on N workers.

- :class:`ThroughputHook`: global step, loss, global samples/s and
  bytes/sample, logged by rank 0 every ``every_n_steps`` steps.
- :class:`GlobalMetricsHook`: sums the local metric variables
  (``tf.compat.v1.metrics`` and Keras metrics: totals, counts, confusion
  counts) over workers, matched by name, when evaluation ends, so the values
  read afterwards are global.

Every hook here runs collectives in the session: all workers must use it
with the same arguments.
"""

from __future__ import annotations

import logging
import time
import zlib
from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from collective import comm
from collective.byte_model import bytes_per_sample, sent_bytes
from collective.sharding import runtime as sharding_runtime

logger = logging.getLogger(__name__)


class PlanHook(tf.compat.v1.train.SessionRunHook):
    """Before the session (and so before step 0): the sharding plan checked whole, agreed on by every worker
    (:class:`collective.sharding.runtime.PlanMismatchError` otherwise) and logged once by rank 0."""

    def __init__(self):
        self._planning = sharding_runtime.active()  # the strategy whose scope makes the session, if any

    def begin(self):
        sharding_runtime.announce(self._planning)


def _global_step_read() -> tf.Tensor:
    step = tf.compat.v1.train.get_global_step()
    if step is None:
        raise RuntimeError("the hook needs a global step; create one with "
                           "tf.compat.v1.train.get_or_create_global_step() before the session")
    return tf.identity(step)


def allreduce_overhead_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one worker's :func:`collective.comm.allreduce` of ``nbytes`` adds to its byte counter."""
    return sent_bytes("allreduce", nbytes, world_size)


class ThroughputHook(tf.compat.v1.train.SessionRunHook):
    """Logs global step, loss, global samples/s and bytes/sample on rank 0.

    Bytes/sample is the bytes all workers sent (their
    :func:`collective.comm.bytes_counter`, summed with one allreduce at each
    log step) divided by the global samples, over the interval since the
    previous log; the hook's own allreduce is left out
    (:func:`collective.byte_model.bytes_per_sample`, the one definition).

    Args:
      every_n_steps: log interval in global steps.
      global_batch_size: samples per step over all workers, if fixed.
      batch_size: samples per step on one worker (global = ``N *``), if fixed.
      samples: a tensor with this step's global sample count (the Estimator
        wrapper passes the synchronised input's count; exact with uneven input).
      loss: a scalar tensor to log (e.g. the global mean loss), or a function that returns it once the
        graph is built (called in ``begin``).
    """

    def __init__(self, every_n_steps: int = 100, global_batch_size: Optional[int] = None,
                 batch_size: Optional[int] = None, samples: Optional[tf.Tensor] = None,
                 loss: Union[tf.Tensor, Callable[[], tf.Tensor], None] = None):
        if every_n_steps is None or every_n_steps < 1:
            raise ValueError(f"every_n_steps={every_n_steps!r} must be a positive number of steps")
        given = [x is not None for x in (global_batch_size, batch_size, samples)]
        if sum(given) > 1:
            raise ValueError("give at most one of global_batch_size, batch_size and samples")
        self._every = int(every_n_steps)
        self._fixed_samples = (global_batch_size if global_batch_size is not None else
                               batch_size * comm.world_size() if batch_size is not None else None)
        self._samples_tensor = samples
        self._loss = loss
        self.records: List[Dict[str, float]] = []

    def begin(self):
        if callable(self._loss):
            self._loss = self._loss()
        self._step_tensor = _global_step_read()
        counter = comm.bytes_counter()
        self._bytes_total = comm.allreduce(tf.cast(counter.read_value(), tf.int64), "sum")
        self._own_bytes = comm.world_size() * allreduce_overhead_bytes(8, comm.world_size())

    def after_create_session(self, session, coord):  # pylint: disable=unused-argument
        self._start_step = int(session.run(self._step_tensor))
        self._last = (time.perf_counter(), self._start_step, self._read_bytes(session), 0)
        self._samples_since = 0
        self._syncs = 1

    def _read_bytes(self, session) -> int:
        return int(session.run(self._bytes_total))

    def before_run(self, run_context):  # pylint: disable=unused-argument
        fetches = {"step": self._step_tensor}
        if self._samples_tensor is not None:
            fetches["samples"] = self._samples_tensor
        if self._loss is not None:
            fetches["loss"] = self._loss
        return tf.compat.v1.train.SessionRunArgs(fetches)

    def after_run(self, run_context, run_values):
        results = run_values.results
        self._samples_since += (int(results["samples"]) if "samples" in results else self._fixed_samples or 0)
        # The step fetched in the run may be read before or after the update: decide on an exact read,
        # the same on every worker, whenever the fetched value says the interval may have ended.
        if (int(results["step"]) + 1) // self._every == self._last[1] // self._every:
            return
        step = int(run_context.session.run(self._step_tensor))
        if step // self._every != self._last[1] // self._every:
            self._record(run_context.session, step, results.get("loss"))

    def _record(self, session, step: int, loss) -> None:
        now = time.perf_counter()
        total_bytes = self._read_bytes(session)
        last_time, last_step, last_bytes, _ = self._last
        sent = total_bytes - last_bytes - self._own_bytes  # the previous log's allreduce
        samples = self._samples_since
        record = {"step": step, "steps": step - last_step, "seconds": now - last_time,
                  "samples": samples, "bytes": sent,
                  "samples_per_sec": samples / max(now - last_time, 1e-9),
                  "bytes_per_sample": bytes_per_sample(sent, samples)}
        if loss is not None:
            record["loss"] = float(loss)
        self.records.append(record)
        if comm.rank() == 0:
            loss_text = f"loss {record['loss']:.6g}, " if "loss" in record else ""
            logger.info("step %d: %s%.1f samples/s (global, %d workers), %.1f bytes/sample", step, loss_text,
                        record["samples_per_sec"], comm.world_size(), record["bytes_per_sample"])
        self._last = (now, step, total_bytes, samples)
        self._samples_since = 0

    def end(self, session):
        step = int(session.run(self._step_tensor))
        if step != self._last[1] and self._samples_since:
            self._record(session, step, None)


class MetricMismatchError(ValueError):
    """Workers built metric variables that cannot be matched by name, shape and dtype."""


def _variable_name(var) -> str:
    return var.op.name if hasattr(var, "op") else var.name


def metric_signature(var) -> int:
    """A number naming ``var`` by name, shape and dtype, the same on every worker that built the same metric."""
    shape = var.shape.as_list() if var.shape.rank is not None else None
    text = f"{_variable_name(var)}|{shape}|{var.dtype.base_dtype.name}"
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


def in_reduction_order(variables: Sequence) -> List:
    """``variables`` once each, ordered by name: the order every worker sums them in.

    Estimator adds Keras metrics' variables to ``METRIC_VARIABLES`` from a
    set, so the collection's order differs between processes; summing by
    position would add one metric's count to another's total.
    """
    unique = {id(v): v for v in variables}
    names = [_variable_name(v) for v in unique.values()]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise MetricMismatchError(f"metric variables {twice} have the same name twice; give each metric a name of "
                                  "its own so the workers can sum it by name")
    return sorted(unique.values(), key=_variable_name)


def unmatched(mine: Sequence, signatures: Sequence[Sequence[int]]) -> List[str]:
    """Lines naming each of ``mine`` (this worker's metric variables) missing from a worker's ``signatures``."""
    lines = []
    for rank, theirs in enumerate(signatures):
        missing = [_variable_name(v) for v in mine if metric_signature(v) not in set(theirs)]
        if missing or len(theirs) != len(mine):
            lines.append(f"rank {rank}: {len(theirs)} metric variables, none matching {missing}" if missing else
                         f"rank {rank}: {len(theirs)} metric variables, this worker {len(mine)}")
    return lines


class GlobalMetricsHook(tf.compat.v1.train.SessionRunHook):
    """Sums metric variables over workers when evaluation ends, matched by name.

    ``tf.compat.v1.metrics`` and Keras metrics keep sums (totals and counts,
    AUC's confusion counts) in variables of the ``METRIC_VARIABLES``
    collection and compute values from them; summing those variables over
    workers once, before the values are read, gives the metric of all
    workers' data. The variables are summed in name order
    (:func:`in_reduction_order`), never by position in the collection, and
    first checked to be the same on every worker (name, shape, dtype): a
    metric variable another worker does not have raises
    :class:`MetricMismatchError` naming it. The hook must run its ``end``
    before the hook that reads the final values (Estimator's evaluation
    hooks do).
    """

    def __init__(self, variables: Optional[Sequence[tf.Variable]] = None):
        self._variables = None if variables is None else list(variables)

    def begin(self):
        variables = self._variables
        if variables is None:
            variables = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.METRIC_VARIABLES)
        self._ordered = in_reduction_order(variables)
        self._sync = tf.no_op()
        self._check = None
        if self._ordered and comm.world_size() > 1:
            signatures = tf.constant([metric_signature(v) for v in self._ordered], tf.int64)
            self._check = (comm.allgather(tf.reshape(tf.size(signatures, out_type=tf.int64), [1])),
                           comm.allgather(signatures))
            summed = comm.grouped_allreduce([v.read_value() if hasattr(v, "read_value") else tf.identity(v)
                                             for v in self._ordered], "sum")
            self._sync = tf.group([v.assign(s) for v, s in zip(self._ordered, summed)],
                                  name="collective_metric_sync")

    def end(self, session):
        if self._check is not None:
            counts, flat = session.run(self._check)
            bounds = [0, *list(np.cumsum(counts))]
            lines = unmatched(self._ordered, [flat[bounds[r]:bounds[r + 1]].tolist() for r in range(len(counts))])
            if lines:
                raise MetricMismatchError(
                    "the workers' evaluation metrics cannot be matched by name, so they cannot be summed: "
                    + "; ".join(lines) + ". Build the same metrics with the same names on every worker "
                    "(a metric made in a Python set or dict order of its own is named in that order)")
        session.run(self._sync)
