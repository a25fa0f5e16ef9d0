"""Synchronous training inside ``CollectiveStrategy.scope()``: gradients averaged where Horovod averages them.

- Dense variables start equal on every worker: their initial value is rank
  0's, broadcast as part of the initialiser (so plain sessions,
  ``MonitoredTrainingSession`` and Estimators all get it, and a restore from
  a checkpoint skips it). Sharded tables and their optimizer slots
  (:mod:`collective.embedding.tables`) are per-worker and never broadcast;
  so is a variable made from a table's value (an ``ExponentialMovingAverage``
  shadow, ``tf.Variable(tf.zeros_like(table))``), tagged as the table's rows.
- ``compute_gradients`` (and so ``minimize``) returns averaged gradients, as
  Horovod's ``DistributedOptimizer`` does: dense gradients are averaged over
  workers with one grouped allreduce (sparse ones of replicated variables by
  allgather or a dense allreduce, whichever sends less). Anything a program
  does between ``compute_gradients`` and ``apply_gradients`` (clipping,
  scaling, summaries, accumulation) sees one process's gradients.
- Sharded tables need no averaging: the exchange scales the gradients the
  lookups send back by ``1 / N`` (``ShardInfo.gradient_scale``), so a table's
  gradient is one process's as ``tf.gradients`` returns it, regularizers and
  other terms of the loss included.
- ``apply_gradients`` averages the gradients that are not averaged yet: those
  of ``tf.gradients`` or a ``GradientTape``. A gradient computed from averaged
  gradients (the output of ``compute_gradients``, clipped or scaled) is never
  averaged again; one read back from a variable (accumulation) is averaged
  once more, which leaves values equal on every worker unchanged.

Every worker's loss must be a mean over its own ``B / N`` examples; the
learning rate is not rescaled. The same holds for ``tf.compat.v1.train``
optimizers (``hb.train``'s included) and Keras optimizers of both
generations (``tf.keras.optimizers`` and ``.legacy``), whose
``apply_gradients`` averages as above.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Callable, List, Sequence, Set

import tensorflow as tf

from collective import comm
from collective.checkpoint import incremental, touched
from collective.embedding import gradient_norms, packed_tables, tables
from collective.embedding.hash_table import dynamic as dynamic_vocabulary
from collective.embedding.hash_table import growth as table_growth
from collective.embedding.table import shard_of
from collective.tf_internals import array_ops, keras_compute_gradients, keras_optimizers, optimizer_lib, patches, \
    variable_v1, variables

_local = threading.local()
# Per graph: the ops whose outputs are averaged gradients.
_averaged_ops: "weakref.WeakKeyDictionary[tf.Graph, Set[tf.Operation]]" = weakref.WeakKeyDictionary()


def _broadcast_initial_value(initial_value, dtype):
    def broadcast():
        value = initial_value() if callable(initial_value) else initial_value
        return comm.broadcast(tf.convert_to_tensor(value, dtype=dtype), root_rank=0, count=False)

    return broadcast


def _create(original, next_creator, kwargs):
    shard = tables.current_shard()
    derived = None
    if shard is None and tables.deriving_from() is None and kwargs.get("variable_def") is None:
        derived = tables.derived_table(kwargs.get("initial_value"))
    if derived is not None:  # made from a table's value (an EMA shadow, zeros_like(table)): its rows, not broadcast
        with tables.deriving(derived):
            var = original(next_creator, **kwargs)
        return tables.tag_derived(var, derived)
    collections = kwargs.get("collections") or []
    local = tf.compat.v1.GraphKeys.LOCAL_VARIABLES in collections
    # Replicated variables start as rank 0's values; so do replicated-layout tables (an unseeded
    # initializer would give each worker its own), while a sharded table's rows and its slots differ by design.
    replicated = tables.deriving_from() is None and (shard is None or shard.replicated)
    if (replicated and not local and comm.world_size() > 1
            and kwargs.get("initial_value") is not None and kwargs.get("variable_def") is None):
        dtype = kwargs.get("dtype")
        kwargs = dict(kwargs, initial_value=_broadcast_initial_value(kwargs["initial_value"], dtype))
    return original(next_creator, **kwargs)


def broadcasting_creator_v1(next_creator=None, **kwargs):
    """``variable_v1.default_variable_creator`` with rank 0's initial values."""
    return _create(patches.original(variable_v1, "default_variable_creator"), next_creator, kwargs)


def broadcasting_creator_v2(next_creator=None, **kwargs):
    """``variables.default_variable_creator_v2`` with rank 0's initial values."""
    return _create(patches.original(variables, "default_variable_creator_v2"), next_creator, kwargs)


def zeros_like_impl(tensor, *args, **kwargs):
    """``array_ops.zeros_like_impl`` that notes a table's ``zeros_like`` as made from the table.

    Of a statically shaped tensor TensorFlow makes a constant, which no
    longer depends on the table: a variable made from it would not be known
    as the table's (:func:`collective.embedding.tables.note_value_of`).
    """
    value = patches.original(array_ops, "zeros_like_impl")(tensor, *args, **kwargs)
    tables.note_value_of(value, tensor)
    return value


def ones_like_impl(tensor, *args, **kwargs):
    """``array_ops.ones_like_impl``, noted as :func:`zeros_like_impl` is."""
    value = patches.original(array_ops, "ones_like_impl")(tensor, *args, **kwargs)
    tables.note_value_of(value, tensor)
    return value


def _tensor_of(grad):
    return grad.values if isinstance(grad, tf.IndexedSlices) else grad


def _mark(grads: Sequence) -> None:
    if tf.executing_eagerly():
        _local.eager_averaged = [_tensor_of(g) for g in grads]  # kept alive, so identity is meaningful
        return
    for grad in grads:
        tensor = _tensor_of(grad)
        _averaged_ops.setdefault(tensor.graph, set()).add(tensor.op)


def _averaged_checker() -> Callable[[object], bool]:
    """A predicate: was this gradient averaged already, or computed from averaged gradients?"""
    if tf.executing_eagerly():
        recent = getattr(_local, "eager_averaged", [])
        return lambda grad: any(_tensor_of(grad) is t for t in recent)
    clean: Set[tf.Operation] = set()

    def averaged(grad) -> bool:
        tensor = _tensor_of(grad)
        if not hasattr(tensor, "op"):
            return False
        marked = _averaged_ops.get(tensor.graph)
        if not marked:
            return False
        seen, stack = set(), [tensor.op]
        while stack:
            op = stack.pop()
            if op in marked:
                return True
            if op in seen or op in clean:
                continue
            seen.add(op)
            stack.extend(t.op for t in op.inputs)
        clean.update(seen)
        return False

    return averaged


def average_gradients(grads_and_vars) -> List[tuple]:
    """The pairs with every gradient of a replicated variable averaged over workers, each once.

    Gradients of sharded tables and their slots are left as they are (the
    exchange made them one process's); gradients averaged before, or computed
    from averaged ones, are not averaged again. An averaged sparse gradient
    keeps the one-process norm attached to it (:func:`gradient_norms.carry`).
    """
    pairs = list(grads_and_vars)
    n = comm.world_size()
    if n == 1:
        return pairs
    already = _averaged_checker()
    dense_at, dense, averaged = [], [], []
    for i, (grad, var) in enumerate(pairs):
        if (grad is None or shard_of(var) is not None or tables.slot_owner(var) is not None
                or packed_tables.is_packed(var) or already(grad)):
            continue
        if isinstance(grad, tf.IndexedSlices) and _dense_is_cheaper(grad, var, n):
            pairs[i] = (_averaged_as_dense(grad, var, n), var)
        elif isinstance(grad, tf.IndexedSlices):
            values, indices = comm.allgather(grad.values), comm.allgather(grad.indices)
            pairs[i] = (tf.IndexedSlices(values / n, indices, grad.dense_shape), var)
        if isinstance(grad, tf.IndexedSlices):
            gradient_norms.carry(grad, pairs[i][0])
            averaged.append(pairs[i][0])
        else:
            dense_at.append(i)
            dense.append(grad)
    for i, reduced in zip(dense_at, comm.grouped_allreduce(dense, "average")):
        pairs[i] = (reduced, pairs[i][1])
        averaged.append(reduced)
    _mark(averaged)
    return pairs


def _dense_is_cheaper(grad: tf.IndexedSlices, var, n: int) -> bool:
    """Whether the replicated ``var``'s sparse gradient crosses the wire cheaper as a dense allreduce.

    Decided from static shapes only, so every worker decides the same: a
    variable with fewer rows than workers (a small table ``embedding_scope()``
    left whole), or one whose dense allreduce sends fewer bytes than the
    allgather of the gradient's static number of rows.
    """
    shape = tf.TensorShape(var.shape)
    if not shape.is_fully_defined() or shape.rank < 1:
        return False
    dims = shape.as_list()
    rows, width = dims[0], max(1, int(shape[1:].num_elements()))
    if rows < n:
        return True
    values_shape = tf.TensorShape(grad.values.shape)
    nnz = values_shape.as_list()[0] if values_shape.rank else None
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
    rows = int(tf.TensorShape(var.shape).as_list()[0])
    values = tf.reshape(grad.values, [tf.shape(grad.values)[0], -1])
    counted = tf.concat([values, tf.ones_like(values[:, :1])], axis=1)
    summed = comm.allreduce(tf.math.unsorted_segment_sum(counted, grad.indices, rows), "sum")
    touched = tf.reshape(tf.where(summed[:, -1] > 0), [-1])
    averaged = tf.gather(summed[:, :-1], touched) / n
    return tf.IndexedSlices(tf.reshape(averaged, tf.concat([tf.shape(touched), tf.shape(grad.values)[1:]], 0)),
                            tf.cast(touched, grad.indices.dtype), grad.dense_shape)


def averaged_compute(optimizer, compute: Callable, *args, **kwargs):
    """``compute(*args, **kwargs)`` (an optimizer's ``compute_gradients``) with its gradients averaged.

    Tables' sparse gradients also carry the squared norm one process's would
    have, which ``tf.clip_by_global_norm`` uses (:mod:`collective.embedding.gradient_norms`).
    """
    tables.watch_slots(optimizer)
    if kwargs.get("var_list") is not None:
        kwargs = dict(kwargs, var_list=packed_tables.map_var_list(kwargs["var_list"]))
    elif len(args) > 1 and args[1] is not None:
        args = (args[0], packed_tables.map_var_list(args[1])) + tuple(args[2:])
    pairs = average_gradients(packed_tables.split_pairs(compute(*args, **kwargs)))
    gradient_norms.attach(args[0] if args else kwargs.get("loss"), pairs)
    return pairs


def gradients_before_updates(pairs: List[tuple]) -> List[tuple]:
    """The pairs, their gradients gated: none is available before all are computed, where updates could race.

    A reference variable (TF1 behaviour) is read when the op reading it runs,
    and gradients of ``tf.gradients`` are not gated (``gate_gradients=False``):
    a backward op may read a variable after another gradient's update wrote it,
    so one process's result varies from run to run. Gated, every update
    follows every read of the backward pass, as ``compute_gradients``' gating
    and resource variables (a read is a value) give.
    """
    refs = [getattr(var, "dtype", tf.float32)._is_ref_dtype for _, var in pairs]  # pylint: disable=protected-access
    if tf.executing_eagerly() or not any(refs):
        return pairs
    at = [i for i, (grad, _) in enumerate(pairs) if isinstance(grad, (tf.Tensor, tf.IndexedSlices))]
    gated = list(pairs)
    for i, grad in zip(at, tf.tuple([pairs[i][0] for i in at])):
        gated[i] = (grad, pairs[i][1])
    return gated


def averaged_apply(optimizer, apply: Callable, grads_and_vars, *args, **kwargs):
    """``apply(pairs, *args, **kwargs)`` (an optimizer's ``apply_gradients``) on gradients averaged once.

    Gradients clipped outside the scope by TensorFlow's own global norm of a
    table's gradient are refused (:func:`collective.embedding.gradient_norms.refuse_foreign_norms`), as is a
    Keras optimizer's ``clipvalue`` over a table's gradient (:func:`~collective.embedding.gradient_norms.refuse_clipvalue`),
    and every gradient is computed before any update (:func:`gradients_before_updates`).
    The result also marks the table rows the update can change, for
    incremental checkpoints (:mod:`collective.checkpoint.touched`), and then
    runs the eviction of hash tables with a vocabulary policy when it is due
    (:mod:`collective.embedding.hash_table.dynamic`).
    """
    grads_and_vars = list(grads_and_vars)
    gradient_norms.refuse_foreign_norms(grads_and_vars)
    if isinstance(optimizer, keras_optimizers):
        gradient_norms.refuse_clipvalue(optimizer, grads_and_vars)
    tables.watch_slots(optimizer, dynamic_vocabulary.remember_slot)
    tables.watch_slots(optimizer, table_growth.remember_slot)
    averaged = average_gradients(grads_and_vars)
    pairs = gradients_before_updates(packed_tables.merge_pairs(averaged))
    table_growth.watch_updates(optimizer, [v for _, v in pairs])  # a growing table's slots grow before updates
    # Packed tables' rows are marked per table (their pairs before the merge).
    done = touched.applied_and_marked(optimizer, packed_tables.split_pairs(averaged), apply(pairs, *args, **kwargs))
    after = [] if done is None else [done.op if isinstance(done, tf.Variable) else done]
    global_step = kwargs.get("global_step", args[0] if args else None)
    if isinstance(optimizer, keras_optimizers):  # (grads_and_vars, name, ...): no global step argument
        global_step = None
    upkeep = dynamic_vocabulary.upkeep_ops(pairs, after, incremental.touched_masks, optimizer, global_step)
    return touched.run_with(done, upkeep) if upkeep else done


def averaging_method(owner, attribute: str, averager: Callable) -> Callable:
    """A replacement of ``owner.attribute`` (an optimizer method) that calls ``averager(self, original, ...)``."""

    @functools.wraps(getattr(owner, attribute))
    def method(self, *args, **kwargs):
        original = patches.original(owner, attribute).__get__(self)  # pylint: disable=unnecessary-dunder-call
        return averager(self, original, *args, **kwargs)

    return method
