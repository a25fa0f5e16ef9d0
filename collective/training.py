"""Synchronous training inside ``CollectiveStrategy.scope()``.

- Dense variables start equal on every worker: their initial value is rank
  0's, broadcast as part of the initialiser (so plain sessions,
  ``MonitoredTrainingSession`` and Estimators all get it, and a restore from
  a checkpoint skips it).
- ``tf.compat.v1.train.Optimizer.apply_gradients`` averages dense gradients
  over workers with one grouped allreduce (sparse ones by allgather), and
  divides the sharded tables' gradients by the world size: every worker's
  loss is a mean over its own ``B / N`` examples, so this reproduces one
  process training on the global batch. The learning rate is not rescaled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Iterator, Optional

import tensorflow as tf

from collective import comm
from collective.embedding.table import SHARDED_COLLECTION, ShardInfo, shard_of, tag
from collective.tf_internals import optimizer_lib, patches, variable_v1, variables

_local = threading.local()


class creating_shard:  # pylint: disable=invalid-name
    """Marks the variable created inside the block as the shard ``info``."""

    def __init__(self, info: ShardInfo):
        self.info = info

    def __enter__(self):
        _local.shard = self.info

    def __exit__(self, *exc):
        _local.shard = None


def _shard_owner(name: Optional[str]) -> Optional[ShardInfo]:
    """The shard a variable named ``name`` belongs to (an optimizer slot of a sharded table)."""
    if not name or tf.executing_eagerly():
        return None
    for table in tf.compat.v1.get_collection(SHARDED_COLLECTION):
        info = shard_of(table)
        if name.startswith(info.name + "/"):
            return info
    return None


def _broadcast_initial_value(initial_value, dtype):
    def broadcast():
        value = initial_value() if callable(initial_value) else initial_value
        return comm.broadcast(tf.convert_to_tensor(value, dtype=dtype), root_rank=0, count=False)

    return broadcast


def _create(original, next_creator, kwargs):
    shard = getattr(_local, "shard", None)
    name = kwargs.get("name")
    slot_of = None if shard is not None else _shard_owner(name)
    collections = kwargs.get("collections") or []
    local = tf.compat.v1.GraphKeys.LOCAL_VARIABLES in collections
    # Replicated variables start as rank 0's values; so do replicated-layout tables (an unseeded
    # initializer would give each worker its own), while a sharded table's rows differ by design.
    replicated = slot_of is None and (shard is None or shard.replicated)
    if (replicated and not local and comm.world_size() > 1
            and kwargs.get("initial_value") is not None and kwargs.get("variable_def") is None):
        dtype = kwargs.get("dtype")
        kwargs = dict(kwargs, initial_value=_broadcast_initial_value(kwargs["initial_value"], dtype))
    var = original(next_creator, **kwargs)
    if slot_of is not None:
        # A slot keeps everything about its table's layout (vocabulary, rank, hash index) but its own name/dim.
        tag(var, dataclasses.replace(slot_of, name=var.op.name if not tf.executing_eagerly() else name,
                                     dim=int(var.shape[-1])))
    return var


def broadcasting_creator_v1(next_creator=None, **kwargs):
    """``variable_v1.default_variable_creator`` with rank 0's initial values."""
    return _create(patches.original(variable_v1, "default_variable_creator"), next_creator, kwargs)


def broadcasting_creator_v2(next_creator=None, **kwargs):
    """``variables.default_variable_creator_v2`` with rank 0's initial values."""
    return _create(patches.original(variables, "default_variable_creator_v2"), next_creator, kwargs)


def average_gradients(grads_and_vars):
    """Averages dense gradients over workers and scales sharded ones; returns new pairs."""
    pairs = list(grads_and_vars)
    n = comm.world_size()
    if n == 1:
        return pairs
    dense_at, dense = [], []
    for i, (grad, var) in enumerate(pairs):
        if grad is None:
            continue
        if shard_of(var) is not None:
            if isinstance(grad, tf.IndexedSlices):
                pairs[i] = (tf.IndexedSlices(grad.values / n, grad.indices, grad.dense_shape), var)
            else:
                pairs[i] = (grad / n, var)
        elif isinstance(grad, tf.IndexedSlices) and _dense_is_cheaper(grad, var, n):
            pairs[i] = (_averaged_as_dense(grad, var, n), var)
        elif isinstance(grad, tf.IndexedSlices):
            values, indices = comm.allgather(grad.values), comm.allgather(grad.indices)
            pairs[i] = (tf.IndexedSlices(values / n, indices, grad.dense_shape), var)
        else:
            dense_at.append(i)
            dense.append(grad)
    for i, reduced in zip(dense_at, comm.grouped_allreduce(dense, "average")):
        pairs[i] = (reduced, pairs[i][1])
    return pairs


def _dense_is_cheaper(grad: tf.IndexedSlices, var, n: int) -> bool:
    """Whether the replicated ``var``'s sparse gradient crosses the wire cheaper as a dense allreduce.

    Decided from static shapes only, so every worker decides the same: a
    variable with fewer rows than workers (a small table ``embedding_scope()``
    left whole), or one whose dense allreduce sends fewer bytes than the
    allgather of the gradient's static number of rows.
    """
    shape = var.shape
    if not shape.is_fully_defined() or shape.rank < 1:
        return False
    rows, width = shape[0], max(1, shape[1:].num_elements())
    if rows < n:
        return True
    nnz = grad.values.shape[0] if grad.values.shape.rank else None
    if nnz is None:
        return False
    return 2 * rows * (width + 1) * (n - 1) / n < nnz * (width + 2) * (n - 1)  # float32 values, int64 indices


def _averaged_as_dense(grad: tf.IndexedSlices, var, n: int) -> tf.IndexedSlices:
    """The allgather path's result (every worker's rows, averaged) from one allreduce of dense sums.

    Each worker scatters its slices into ``[rows, width + 1]`` (the last
    column counts the row's slices); after the sum, the rows any worker
    touched are returned as slices, so optimizers still update only those
    rows, as they do on the allgathered slices.
    """
    rows = int(var.shape[0])
    values = tf.reshape(grad.values, [tf.shape(grad.values)[0], -1])
    counted = tf.concat([values, tf.ones_like(values[:, :1])], axis=1)
    summed = comm.allreduce(tf.math.unsorted_segment_sum(counted, grad.indices, rows), "sum")
    touched = tf.reshape(tf.where(summed[:, -1] > 0), [-1])
    averaged = tf.gather(summed[:, :-1], touched) / n
    return tf.IndexedSlices(tf.reshape(averaged, tf.concat([tf.shape(touched), tf.shape(grad.values)[1:]], 0)),
                            tf.cast(touched, grad.indices.dtype), grad.dense_shape)


@contextlib.contextmanager
def gradients_averaged() -> Iterator[None]:
    """Inside the block, ``Optimizer.apply_gradients`` takes the gradients as already averaged.

    ``hb.train.wraps_optimizer`` averages once and then runs the user's
    ``apply_gradients``, which may call ``super().apply_gradients`` (the
    scope's averaging one): that call must not average (and divide sharded
    tables' gradients by N) a second time.
    """
    previous = getattr(_local, "averaged", False)
    _local.averaged = True
    try:
        yield
    finally:
        _local.averaged = previous


def averaging_apply_gradients(self, grads_and_vars, global_step=None, name=None):
    """``Optimizer.apply_gradients`` on gradients averaged over workers."""
    apply = patches.original(optimizer_lib.Optimizer, "apply_gradients")
    if getattr(_local, "averaged", False):
        return apply(self, grads_and_vars, global_step=global_step, name=name)
    return apply(self, average_gradients(grads_and_vars), global_step=global_step, name=name)


patches.register(variable_v1, "default_variable_creator", broadcasting_creator_v1,
                 "dense variables start as rank 0's values")
patches.register(variables, "default_variable_creator_v2", broadcasting_creator_v2, "the same for tf.Variable")
patches.register(optimizer_lib.Optimizer, "apply_gradients", averaging_apply_gradients,
                 "dense gradients averaged over workers, sharded gradients scaled for a global mean")
