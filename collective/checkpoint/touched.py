"""Which rows of each sharded table changed since the last checkpoint: the input of incremental saves.

Each table (its values variable, by object) gets one boolean mask over its
local rows on this worker, ``<table>/touched_rows``. The optimizer's
``apply_gradients`` (replaced inside ``CollectiveStrategy.scope()``, see
:mod:`collective.integration.training`) marks the local rows its gradient
reaches: the owner of a row is the only worker that updates it, so the
masks of all workers together name exactly the rows that one process would
have updated. A save (full or incremental) clears them once every worker
has committed it.

A row is marked when the update can change it:

- an optimizer whose sparse update touches only the gradient's rows (plain
  SGD, Adagrad, Momentum, RMSProp, Ftrl, Adadelta, the proximal ones, SOK's
  LazyAdam, Keras SGD without momentum and Adagrad): the gradient's rows;
- any other optimizer, or a dense gradient of a table: every row, logged once
  per table. ``tf.compat.v1.train.AdamOptimizer`` and Keras Adam decay every
  row's moments (and so move every row) at each step, so their deltas are
  as large as a full checkpoint; they are still exact.

A hash table's mask is over its index rows: a key inserted by a training
lookup receives a gradient, so new keys are marked with their rows. Rows
changed outside an optimizer (``assign``, ``scatter_update`` by hand) are not
seen: take a full save after such a change.

The masks are per-worker state in no collection (never saved, broadcast or
exported); each op that uses one initialises it first if needed, so a
program that runs only ``global_variables_initializer`` works unchanged.
"""

from __future__ import annotations

import logging
from typing import Iterable, List, Optional

import tensorflow as tf

from collective.embedding import tables
from collective.embedding.table import shard_of

logger = logging.getLogger("collective.checkpoint")

TOUCHED_COLLECTION = "collective_touched_rows"
_ATTRIBUTE = "_collective_touched_rows"


def _row_local_classes() -> tuple:
    v1 = tf.compat.v1.train
    classes = [v1.GradientDescentOptimizer, v1.AdagradOptimizer, v1.MomentumOptimizer, v1.RMSPropOptimizer,
               v1.FtrlOptimizer, v1.ProximalAdagradOptimizer, v1.ProximalGradientDescentOptimizer,
               v1.AdadeltaOptimizer, v1.AdagradDAOptimizer, tf.keras.optimizers.legacy.Adagrad,
               tf.keras.optimizers.legacy.SGD, tf.keras.optimizers.SGD, tf.keras.optimizers.Adagrad]
    return tuple(classes)


_SPARSE_METHODS = ("update_step", "_resource_apply_sparse")
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


def mask_of(table: tf.Variable) -> tf.Variable:
    """The touched-rows mask of ``table`` (a sharded table's values variable), created on first use."""
    owner = tables.slot_owner(table)
    table = table if owner is None else owner
    mask = getattr(table, _ATTRIBUTE, None)
    if mask is not None:
        return mask
    info = shard_of(table)
    with tf.init_scope(), table.graph.as_default(), table.graph.name_scope(None):
        mask = tf.compat.v1.Variable(tf.zeros([info.local_rows], tf.bool), trainable=False, collections=[],
                                     name=info.name.replace(":", "_") + "/touched_rows", use_resource=True)
    tf.compat.v1.add_to_collection(TOUCHED_COLLECTION, mask)
    setattr(table, _ATTRIBUTE, mask)
    return mask


def _initialized(mask: tf.Variable) -> tf.Tensor:
    """``True`` once ``mask`` holds a value: initialises it (all clear) on first use."""

    def init():  # the assign is built inside the branch: it runs only when the mask has no value yet
        assign = tf.raw_ops.AssignVariableOp(resource=mask.handle, value=tf.zeros([mask.shape[0]], tf.bool))
        with tf.control_dependencies([assign]):
            return tf.constant(True)

    return tf.cond(tf.compat.v1.is_variable_initialized(mask), lambda: tf.constant(True), init)


def mark(optimizer, grads_and_vars: Iterable) -> List[tf.Operation]:
    """Ops marking the rows that applying ``grads_and_vars`` with ``optimizer`` can change, per sharded table.

    Graph mode only (incremental checkpoints are); eagerly it marks nothing.
    """
    if tf.executing_eagerly():
        return []
    ops = []
    row_local: Optional[bool] = None
    for grad, var in grads_and_vars:
        if grad is None or shard_of(var) is None or tables.slot_owner(var) is not None:
            continue
        if row_local is None:
            row_local = updates_only_gradient_rows(optimizer)
        mask = mask_of(var)
        with tf.control_dependencies([_initialized(mask)]):
            if row_local and isinstance(grad, tf.IndexedSlices):
                rows = tf.cast(tf.reshape(grad.indices, [-1]), tf.int64)
                ops.append(tf.raw_ops.ResourceScatterUpdate(resource=mask.handle, indices=rows,
                                                            updates=tf.ones_like(rows, tf.bool)))
            else:
                _log_every_row(var, optimizer, grad)
                ops.append(tf.raw_ops.AssignVariableOp(resource=mask.handle, value=tf.ones([mask.shape[0]], tf.bool)))
    return ops


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


def marked(table: tf.Variable) -> tf.Tensor:
    """``table``'s mask: bool per local row, set for the rows marked since the masks were last cleared."""
    mask = mask_of(table)
    with tf.control_dependencies([_initialized(mask)]):
        return tf.raw_ops.ReadVariableOp(resource=mask.handle, dtype=tf.bool)


def touched_rows(table: tf.Variable) -> tf.Tensor:
    """The local rows of ``table`` marked since the masks were last cleared (int64, ascending)."""
    return tf.reshape(tf.where(marked(table)), [-1])


def clear(tables_: Iterable[tf.Variable]) -> tf.Operation:
    """One op clearing the masks of ``tables_`` (after every worker committed a save)."""
    masks = [mask_of(t) for t in tables_]
    return tf.group(*[tf.raw_ops.AssignVariableOp(resource=m.handle, value=tf.zeros([m.shape[0]], tf.bool))
                      for m in masks])
