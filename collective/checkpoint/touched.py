"""Which rows of each sharded table changed: since the last checkpoint (incremental saves) and when (SOK dumps).

Each table (its values variable, by object) has, on this worker, a boolean
mask over its local rows, ``<table>/touched_rows``, and a scalar
``<table>/touched_every_row``. The optimizer's ``apply_gradients`` (replaced
inside ``CollectiveStrategy.scope()``, see :mod:`collective.integration.training`,
and ``sok.OptimizerWrapper``'s) marks the local rows its gradient reaches:
the owner of a row is the only worker that updates it, so the marks of all
workers together name exactly the rows that one process would have updated.
A save (full or incremental) clears them once every worker has committed it.

A row is marked when the update can change it:

- an optimizer whose sparse update touches only the gradient's rows (plain
  SGD, Adagrad, Momentum, RMSProp, Ftrl, Adadelta, the proximal ones, SOK's
  LazyAdam, Keras SGD without momentum and Adagrad): the gradient's rows, one
  boolean scatter per table and step;
- any other optimizer, or a dense gradient of a table: every row, by setting
  the table's scalar flag (logged once per table). ``tf.compat.v1.train.AdamOptimizer``
  and Keras Adam decay every row's moments (and so move every row) at each
  step, so their deltas are as large as a full checkpoint; they are still exact.

Tables that opt in with :func:`record_update_times` (SOK's ``sok.Variable``
and ``sok.DynamicVariable``, for ``sok.incremental_dump``) also keep, per
local row, the UNIX time in seconds (``tf.timestamp()``, float64) of its last
update (-inf before any), ``<table>/row_update_time``, plus
``<table>/every_row_update_time`` for the optimizers that move every row;
these are never cleared.
:func:`updated_since` reads them. Other tables pay nothing for it.

A hash table's marks are over its index rows: a key inserted by a training
lookup receives a gradient, so new keys are marked with their rows. Rows
changed outside an optimizer (``assign``, ``scatter_update`` by hand) are not
seen: take a full save (or ``sok.dump``) after such a change.

The state is per worker and in no collection (never saved, broadcast or
exported). A table made eagerly (TF2) gets eager state, marked as each step
runs (in ``tf.function`` too). In a graph, a row-local mark initialises the
mask first if needed (a ``tf.cond``, so a program that runs only
``global_variables_initializer`` or restores without initialisers works
unchanged); the every-row flag and time need no initialisation, so an
optimizer that moves every row costs one scalar assign per table and step
(two for a SOK table).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Iterable, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from collective.embedding import tables
from collective.embedding.hash_table.growth import hidden, never_marked
from collective.embedding.table import shard_of

logger = logging.getLogger("collective.checkpoint")

TOUCHED_COLLECTION = "collective_touched_rows"
_ATTRIBUTE = "_collective_touched_rows"
_TIMED = "_collective_records_update_times"


def _row_local_classes() -> tuple:
    v1 = tf.compat.v1.train
    classes = [v1.GradientDescentOptimizer, v1.AdagradOptimizer, v1.MomentumOptimizer, v1.RMSPropOptimizer,
               v1.FtrlOptimizer, v1.ProximalAdagradOptimizer, v1.ProximalGradientDescentOptimizer,
               v1.AdadeltaOptimizer, v1.AdagradDAOptimizer, tf.keras.optimizers.legacy.Adagrad,
               tf.keras.optimizers.legacy.SGD, tf.keras.optimizers.SGD, tf.keras.optimizers.Adagrad]
    return tuple(classes)


# Where each optimizer family implements its sparse update (GradientDescentOptimizer has only the last).
_SPARSE_METHODS = ("update_step", "_resource_apply_sparse", "_resource_apply_sparse_duplicate_indices")
ROW_LOCAL_ATTRIBUTE = "collective_updates_only_gradient_rows"
"""A class attribute: ``True`` on an optimizer class whose own sparse update changes only the gradient's rows."""


def updates_only_gradient_rows(optimizer) -> bool:
    """Whether ``optimizer``'s sparse update changes only the rows its gradient names (see the module docstring).

    Decided by the class that implements the sparse update (subclasses that
    only wrap an optimizer, such as ``hb.train``'s, inherit it), so a
    subclass that rewrites the update is treated as unknown unless it sets
    :data:`ROW_LOCAL_ATTRIBUTE` (``sok.LazyAdamOptimizer`` does).
    """
    known = _row_local_classes()
    for method in _SPARSE_METHODS:
        owner = next((cls for cls in type(optimizer).__mro__ if method in vars(cls)), None)
        if owner is None or owner in (tf.keras.optimizers.Optimizer, tf.compat.v1.train.Optimizer,
                                      tf.keras.optimizers.legacy.Optimizer):
            continue
        if vars(owner).get(ROW_LOCAL_ATTRIBUTE):
            return True
        if owner not in known:
            return False
        if owner is tf.keras.optimizers.SGD or owner is tf.keras.optimizers.legacy.SGD:
            return not _has_momentum(optimizer)
        return True
    return False


def _has_momentum(optimizer) -> bool:
    momentum = getattr(optimizer, "momentum", 0)
    try:
        return float(tf.keras.backend.get_value(momentum)) != 0.0
    except Exception:  # pylint: disable=broad-except  (a tensor we cannot read now: assume momentum)
        return True


@dataclasses.dataclass
class _Rows:
    """One table's marks on this worker (see the module docstring)."""

    mask: tf.Variable
    every: tf.Variable
    eager: bool
    times: Optional[tf.Variable] = None
    every_time: Optional[tf.Variable] = None


def _table(var: tf.Variable) -> tf.Variable:
    owner = tables.slot_owner(var)
    table = var if owner is None else owner
    return getattr(table, "packed_table", table)  # the Saver's view of a packed table's rows: the table's marks


def _new_state(table: tf.Variable, suffix: str, value: tf.Tensor, growing: bool = False) -> tf.Variable:
    """A per-worker variable of ``table``'s: created eagerly for an eager table, else in its graph, in no collection.

    ``growing``: one value per row of a growing hash table (its first dimension unknown, caught up as it grows).
    """
    name = shard_of(table).name.replace(":", "_") + "/" + suffix
    with tables.deriving(table):  # per-worker state: never broadcast
        if tf.executing_eagerly():
            return tf.Variable(value, trainable=False, name=name)
        with table.graph.as_default(), table.graph.name_scope(None):
            shape = tf.TensorShape([None]) if growing else None
            return tf.compat.v1.Variable(value, trainable=False, collections=[], name=name, use_resource=True,
                                         shape=shape)


def _rows_of(table: tf.Variable) -> _Rows:
    """``table``'s marks (a sharded table's values variable or one of its slots), created on first use."""
    table = _table(table)
    rows = getattr(table, _ATTRIBUTE, None)
    if rows is None:
        local, growing = shard_of(table).local_rows, _growth(table) is not None
        with tf.init_scope():
            if growing:  # its initial rows, of a length static shape inference does not see
                local = hidden(_growth(table).sizes[0])
            eager = tf.executing_eagerly()
            rows = _Rows(_new_state(table, "touched_rows", tf.zeros([local], tf.bool), growing),
                         _new_state(table, "touched_every_row", tf.constant(False)), eager)
            if getattr(table, _TIMED, False):  # never updated: -inf, before any time asked for
                rows.times = _new_state(table, "row_update_time", tf.fill([local], tf.constant(-np.inf, tf.float64)),
                                        growing)
                rows.every_time = _new_state(table, "every_row_update_time", tf.constant(-np.inf, tf.float64))
        if not eager:
            with table.graph.as_default():
                tf.compat.v1.add_to_collection(TOUCHED_COLLECTION, rows.mask)
        setattr(table, _ATTRIBUTE, rows)
    return rows


def _growth(table: tf.Variable):
    """The :class:`~collective.embedding.hash_table.growth.Growth` of a growing hash table, else None."""
    return getattr(shard_of(table).hash_index, "growth", None)


def _caught_up(table: tf.Variable, rows: _Rows, variable: tf.Variable, after: tf.Tensor) -> List:
    """Control inputs that initialise ``variable`` if needed and, for a growing hash table, grow it to the
    index's rows (after ``after``: this step's lookups)."""
    ready = _ready(rows, variable)
    if _growth(table) is None:
        return ready
    with tf.control_dependencies(ready + [after]):
        return [shard_of(table).hash_index.catch_up(variable, fill=never_marked(variable.dtype))]


def mask_of(table: tf.Variable) -> tf.Variable:
    """The touched-rows mask of ``table`` (a sharded table's values variable), created on first use.

    It holds the rows marked one by one; :func:`marked` adds the every-row flag.
    """
    return _rows_of(table).mask


def record_update_times(table: tf.Variable) -> tf.Variable:
    """Makes ``table`` (a sharded table) keep each local row's last update time (for ``sok.incremental_dump``)."""
    if getattr(table, _ATTRIBUTE, None) is not None and getattr(table, _ATTRIBUTE).times is None:
        raise RuntimeError(f"table {shard_of(table).name}: record_update_times must be called before its first "
                           "training step")
    setattr(table, _TIMED, True)
    return table


def records_update_times(table: tf.Variable) -> bool:
    """Whether ``table`` keeps its rows' update times (:func:`record_update_times`)."""
    return bool(getattr(_table(table), _TIMED, False))


def _never(variable: tf.Variable) -> tf.Tensor:
    """``variable``'s value before any update: not marked (bool), or updated at -inf (an update time)."""
    dtype = variable.dtype.base_dtype
    shape = variable.shape if variable.shape.is_fully_defined() else tf.shape(variable.initial_value)
    return tf.fill(shape, tf.constant(never_marked(dtype), dtype))


def _ready(rows: _Rows, variable: tf.Variable) -> List[tf.Tensor]:
    """Control inputs that initialise ``variable`` (all clear) first when it has no value yet (graph state only)."""
    if rows.eager:
        return []

    def init():  # the assign is built inside the branch: it runs only when the variable has no value yet
        assign = tf.raw_ops.AssignVariableOp(resource=variable.handle, value=_never(variable))
        with tf.control_dependencies([assign]):
            return tf.constant(True)

    return [tf.cond(tf.compat.v1.is_variable_initialized(variable), lambda: tf.constant(True), init)]


def mark(optimizer, grads_and_vars: Iterable) -> List[tf.Operation]:
    """Marks the rows that applying ``grads_and_vars`` with ``optimizer`` can change, per sharded table.

    In a graph (``tf.function`` included) returns the ops that mark; eagerly
    marks at once and returns ``[]``.
    """
    ops = []
    row_local: Optional[bool] = None
    now = None
    for grad, var in grads_and_vars:
        if grad is None or shard_of(var) is None or tables.slot_owner(var) is not None:
            continue
        if row_local is None:
            row_local = updates_only_gradient_rows(optimizer)
        rows = _rows_of(var)
        if rows.times is not None and now is None:
            now = tf.timestamp()
        if row_local and isinstance(grad, tf.IndexedSlices):
            local = tf.cast(tf.reshape(grad.indices, [-1]), tf.int64)
            with tf.control_dependencies(_caught_up(var, rows, rows.mask, local)):
                ops.append(tf.raw_ops.ResourceScatterUpdate(resource=rows.mask.handle, indices=local,
                                                            updates=tf.ones_like(local, tf.bool)))
            if rows.times is not None:
                with tf.control_dependencies(_caught_up(var, rows, rows.times, local)):
                    ops.append(tf.raw_ops.ResourceScatterUpdate(
                        resource=rows.times.handle, indices=local, updates=tf.fill(tf.shape(local), now)))
        else:
            _log_every_row(var, optimizer, grad)
            ops.append(tf.raw_ops.AssignVariableOp(resource=rows.every.handle, value=tf.constant(True)))
            if rows.times is not None:
                ops.append(tf.raw_ops.AssignVariableOp(resource=rows.every_time.handle, value=now))
    return [] if tf.executing_eagerly() else ops


_logged = set()


def _log_every_row(var, optimizer, grad) -> None:
    key = (shard_of(var).name, type(optimizer).__name__)
    if key in _logged:
        return
    _logged.add(key)
    why = "its gradient is dense" if not isinstance(grad, tf.IndexedSlices) else \
        f"{type(optimizer).__name__} may change rows outside the gradient's (e.g. Adam's moment decay)"
    logger.info("table %s: incremental checkpoints hold every row, because %s; a row-local optimizer "
                "(Adagrad, SGD, Ftrl, sok.LazyAdamOptimizer, ...) keeps deltas to the rows trained", key[0], why)


def _read(rows: _Rows, variable: tf.Variable) -> tf.Tensor:
    with tf.control_dependencies(_ready(rows, variable)):
        return tf.raw_ops.ReadVariableOp(resource=variable.handle, dtype=variable.dtype.base_dtype)


def marked(table: tf.Variable) -> tf.Tensor:
    """bool per local row of ``table``: set for the rows marked since the marks were last cleared."""
    rows = _rows_of(table)
    return tf.logical_or(_read(rows, rows.mask), _read(rows, rows.every))


def marked_at(table: tf.Variable, local: tf.Tensor) -> tf.Tensor:
    """:func:`marked` at the local rows ``local`` of ``table``.

    A growing table's mask reaches its allocation only before the next marking, so rows a lookup added
    since (past the mask's end) are marked by the every-row flag alone.
    """
    if _growth(table) is None:
        return tf.gather(marked(table), local)
    rows = _rows_of(table)
    mask = _read(rows, rows.mask)
    inside = local < tf.shape(mask, out_type=local.dtype)[0]
    held = tf.where(inside, tf.gather(mask, tf.where(inside, local, tf.zeros_like(local))), False)
    return tf.logical_or(held, _read(rows, rows.every))


def row_state(table: tf.Variable) -> List[Tuple[tf.Tensor, tf.Variable]]:
    """``[(value, variable)]`` of ``table``'s per-row marks: the touched mask and, where kept, the update times.

    An eviction that moves rows (:mod:`collective.embedding.hash_table.dynamic`) moves these with them and
    fills the freed rows with the value of a row never updated
    (:func:`~collective.embedding.hash_table.growth.never_marked`).
    """
    rows = _rows_of(table)
    state = [(marked(table), rows.mask)]
    if rows.times is not None:
        state.append((_read(rows, rows.times), rows.times))
    return state


def touched_rows(table: tf.Variable) -> tf.Tensor:
    """The local rows of ``table`` marked since the marks were last cleared (int64, ascending)."""
    return tf.reshape(tf.where(marked(table)), [-1])


def updated_since(table: tf.Variable, seconds) -> tf.Tensor:
    """bool per local row of ``table``: updated by an optimizer at or after UNIX time ``seconds``.

    Raises:
      ValueError: ``table`` does not record update times (:func:`record_update_times`).
    """
    if not records_update_times(table):
        raise ValueError(f"table {shard_of(table).name} does not record its rows' update times; only SOK tables "
                         "(sok.Variable, sok.DynamicVariable) do")
    rows = _rows_of(table)
    last = tf.maximum(_read(rows, rows.times), _read(rows, rows.every_time))
    # A Python number goes straight to float64: as a float32 constant it would be rounded to 128 s.
    since = tf.cast(seconds, tf.float64) if tf.is_tensor(seconds) else tf.constant(seconds, tf.float64)
    return last >= since


def clear(tables_: Iterable[tf.Variable]) -> tf.Operation:
    """One op clearing the marks of ``tables_`` (after every worker committed a save); update times stay."""
    ops = []
    for table in tables_:
        rows = _rows_of(table)
        if rows.mask.shape.is_fully_defined():
            cleared = tf.zeros([rows.mask.shape[0]], tf.bool)
        else:  # a growing table's rows now
            with tf.control_dependencies(_ready(rows, rows.mask)):
                cleared = tf.zeros(tf.raw_ops.VariableShape(input=rows.mask.handle), tf.bool)
        ops.append(tf.raw_ops.AssignVariableOp(resource=rows.mask.handle, value=cleared))
        ops.append(tf.raw_ops.AssignVariableOp(resource=rows.every.handle, value=tf.constant(False)))
    return tf.group(*ops)


def applied_and_marked(optimizer, grads_and_vars: List, result):
    """``result`` (what ``apply_gradients`` returned for ``grads_and_vars``) that also marks their rows."""
    ops = mark(optimizer, grads_and_vars)
    return run_with(result, ops) if ops else result


def run_with(result, ops: List[tf.Operation]):
    """``result`` (an op, a tensor or a variable an ``apply_gradients`` returned) that also runs ``ops``."""
    if isinstance(result, tf.Operation):
        return tf.group(result, *ops, name=result.name.split(":")[0].split("/")[-1] + "_and_mark_rows")
    if isinstance(result, tf.Tensor):
        with tf.control_dependencies(ops):
            return tf.identity(result)
    if isinstance(result, tf.Variable) or result is None:
        with tf.control_dependencies(ops + ([result.op] if result is not None and hasattr(result, "op") else [])):
            return tf.group(*ops) if result is None else tf.identity(result)
    return result
